"""Is a trtfuse engine faster than the engine TensorRT builds alone? `trtfuse compile --baseline` over the committed
fixtures, a ModelOpt FP8 export and a ~1B-parameter Llama export, one table for docs/performance.md.

Each model is compiled in a subprocess (`trtfuse compile MODEL --baseline --json -q`, KV-cache models with a
prefill and a decode profile) and its A/B read from the JSON: per case TensorRT alone, trtfuse, the difference and
its 95 % interval, the norm sites' time in each engine, and each engine's GPU memory. Needs TensorRT and an NVIDIA
GPU; without them it says so in one line and exits 3. The ~1B model is a random fp16 Llama (hidden 2048, 16 layers:
benchmarks/check_memory.py's "full" size) exported by models/export.py, which needs the export extra; --no-large
leaves it out.

\b
    python3 benchmarks/engine_ab.py                          # every model, the table on stdout
    python3 benchmarks/engine_ab.py --docs                   # and into docs/performance.md ("Engine A/B")
    python3 benchmarks/engine_ab.py --no-large --rounds 9    # the small models only, fewer rounds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "models" / "fixtures"
# (label, path, KV cache): the committed fixtures of three families, the KV fixture, a real ModelOpt FP8 export.
MODELS = [
    ("Qwen3 TorchScript fp16", FIXTURES / "qwen3-torchscript-fp16.onnx", False),
    ("Llama TorchScript fp16", FIXTURES / "llama-torchscript-fp16.onnx", False),
    ("Gemma3 dynamo fp16", FIXTURES / "gemma3-dynamo-fp16.onnx", False),
    ("Qwen3 dynamo fp32 KV", FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx", True),
    ("Qwen3 ModelOpt FP8 KV", FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx", True),
]
DOCS = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- engine_ab.py: begin -->", "<!-- engine_ab.py: end -->"


def compile_with_baseline(model: Path, kv: bool, folder: Path, rounds: int) -> dict:
    """`trtfuse compile --baseline --json` of `model` in a subprocess; its JSON (with the A/B under "baseline")."""
    profiles = ["--profile", "prefill", "--profile", "decode"] if kv else ["--profile", "default"]
    command = [sys.executable, "-m", "trtfuse.cli.main", "compile", str(model), "-o", str(folder / "m.engine")]
    command += [*profiles, "--baseline", "--ab-rounds", str(rounds), "--json", "-q"]
    print(f"compiling {model.name} with --baseline", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    result = json.loads(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"{model}: compile exited {done.returncode}: {result.get('error')}")
    return result


def large_export(folder: Path) -> Path:
    """The ~1B random Llama, built and exported as benchmarks/check_memory.py does."""
    sys.path.insert(0, str(Path(__file__).parent))
    import check_memory

    path, _ = check_memory.export(check_memory.SIZES["full"], folder)
    return path


def rows(label: str, result: dict) -> list[str]:
    ab = result["baseline"]
    sites = ab["norm_sites"]
    memory = ab["gpu_memory_bytes"]
    out = []
    for case in ab["cases"]:
        site = sites.get(case["name"], {})
        site_text = " / ".join(
            "-" if site.get(side) is None else f"{site[side]['ms']:.4f}" for side in ("baseline", "trtfuse")
        )
        out.append(
            f"| {label} | {case['name']} | {case['baseline_ms']:.4f} | {case['trtfuse_ms']:.4f} | "
            f"{case['difference_pct']:+.1f} % | ±{case['noise_ms']:.4f} | {case['verdict']} | {site_text} | "
            f"{memory['baseline'] / 2**20:.0f} / {memory['trtfuse'] / 2**20:.0f} |"
        )
    return out


def table(results: list[tuple[str, dict]]) -> str:
    head = (
        "| model | case | TensorRT alone (ms) | trtfuse (ms) | difference | noise (95 %) | verdict | "
        "norm sites (ms, alone / trtfuse) | GPU memory (MiB, alone / trtfuse) |\n|---|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(row for label, result in results for row in rows(label, result))])


def write_docs(text: str, gpu: str, tensorrt: str, command: str) -> None:
    """The table between the markers of docs/performance.md's "Engine A/B" section."""
    docs = DOCS.read_text(encoding="utf-8")
    if BEGIN not in docs or END not in docs:
        raise SystemExit(f"{DOCS}: no {BEGIN} ... {END} markers to write the table between")
    block = f"{BEGIN}\n{gpu}, TensorRT {tensorrt}; `{command}`\n\n{text}\n{END}"
    before, rest = docs.split(BEGIN, 1)
    DOCS.write_text(before + block + rest.split(END, 1)[1], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="Paired rounds per case (compile --ab-rounds).")
    parser.add_argument("--no-large", action="store_true", help="Leave out the ~1B-parameter export.")
    parser.add_argument("--keep", type=Path, help="Build the ~1B export in this folder and keep it for a later run.")
    parser.add_argument("--docs", action="store_true", help="Write the table into docs/performance.md.")
    args = parser.parse_args()
    if importlib.util.find_spec("tensorrt") is None:
        print(
            "engine_ab.py: TensorRT's Python module `tensorrt` is not installed (pip install -e '.[gpu]' on a machine "
            "with an NVIDIA GPU); nothing measured",
            file=sys.stderr,
        )
        raise SystemExit(3)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        models = list(MODELS)
        if not args.no_large:
            folder = args.keep or Path(scratch) / "large"
            models.append(("Llama ~1B dynamo fp16 KV", large_export(folder), True))
        for index, (label, path, kv) in enumerate(models):
            folder = Path(scratch) / str(index)
            folder.mkdir()
            results.append((label, compile_with_baseline(path, kv, folder, args.rounds)))
    text = table(results)
    print(text)
    if args.docs:
        ab = results[0][1]["baseline"]
        write_docs(text, ab["gpu"], ab["tensorrt"], " ".join(["python3", *sys.argv]))


if __name__ == "__main__":
    main()
