"""Peak memory and wall time of `trtfuse check`, `check --generate 16` and `generate` on a random fp16 Llama.

Builds a Hugging Face Llama checkpoint from a config with random weights (no hub access), exports it as
`models/export.py --cache --checkpoint DIR --exporter dynamo --dtype float16` does (KV cache, external data), fuses it,
then runs each command in a subprocess and prints its wall time, its peak RSS and that RSS over the weights' bytes.
Not a timed test: the numbers depend on the machine. The full size (the default) is a 0.85 B-parameter model, hidden
2048, 16 layers, GQA 16/4, vocabulary 32000: 1.7 GB of weights, ~4 GB of disk and, for the export, ~6 GB of RAM.
CPU time (user + system) is printed beside the wall time: on a machine others share, it moves less.

\b
    python3 benchmarks/check_memory.py                       # the 0.85 B model
    python3 benchmarks/check_memory.py --size small          # hidden 1024, 8 layers: 0.16 B, a quick run
    python3 benchmarks/check_memory.py --keep /tmp/cm        # keep (and on a later run reuse) the exported model
    python3 benchmarks/check_memory.py --keep /tmp/cm --repo ../main --only check   # another checkout's trtfuse
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = "16"
# What is measured after `fuse`, by name.
COMMANDS = {
    "check": ["check", "{original}", "{fused}"],
    "check-generate": ["check", "{original}", "{fused}", "--generate", STEPS],
    "generate": ["generate", "{fused}", "--steps", STEPS],
}


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    intermediate: int
    heads: int = 16
    kv_heads: int = 4
    vocab: int = 32000

    @property
    def parameters(self) -> int:
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * layer + 2 * self.vocab * self.hidden + self.hidden


SIZES = {
    "full": Size(hidden=2048, layers=16, intermediate=5632),
    "small": Size(hidden=1024, layers=8, intermediate=2816),
}


@dataclass(frozen=True)
class Measured:
    command: str
    seconds: float
    cpu_seconds: float
    peak_rss: int
    exit_code: int


def build_checkpoint(size: Size, folder: Path) -> None:
    """A random fp16 Llama of `size`, written by `save_pretrained` (config.json and safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    with torch.no_grad():
        for module in model.modules():
            # Norm weights away from 1, as models/export.py makes them: a fusion that drops the weight shows.
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.copy_(1.0 + 0.1 * torch.randn_like(module.weight))
    model.save_pretrained(folder)


def measure(label: str, command: list[str], repo: Path = REPO) -> Measured:
    """Wall seconds and peak RSS of `command` run in a subprocess from the root of `repo`, whose trtfuse it imports.

    The command runs under a small Python of its own (`peak_rss_of`): Linux counts the RSS a process had before
    `exec` in its peak, so a command forked straight from this process (which built the model) would inherit its
    size."""
    print(f"running {label}: {' '.join(command)}", file=sys.stderr, flush=True)
    environment = {**os.environ, "PYTHONPATH": str(repo)}
    wrapper = [sys.executable, __file__, "--peak-rss-of", *command]
    start = time.perf_counter()
    done = subprocess.run(wrapper, cwd=repo, env=environment, stdout=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - start
    *printed, usage = done.stdout.rstrip("\n").split("\n")
    cpu_seconds, peak = usage.split()
    if done.returncode not in (0, 1):
        raise SystemExit(f"{label} failed with exit status {done.returncode}:\n" + "\n".join(printed))
    print("\n".join(printed), file=sys.stderr)
    return Measured(label, seconds, float(cpu_seconds), int(peak), done.returncode)


def peak_rss_of(command: list[str]) -> None:
    """Runs `command`, passes its output on, then prints its CPU seconds (user + system) and its peak RSS in bytes as
    the last line; exits with its status."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(process.stdout.read())
    _, status, usage = os.wait4(process.pid, 0)
    # ru_maxrss is in KiB on Linux.
    print(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
    sys.exit(os.waitstatus_to_exitcode(status))


def export(size: Size, folder: Path) -> tuple[Path, Measured]:
    """The checkpoint exported by models/export.py (reused when `folder` already holds it)."""
    onnx_path = folder / "export" / "checkpoint-dynamo-fp16-kv.onnx"
    if onnx_path.exists():
        return onnx_path, Measured("export (reused)", 0.0, 0.0, 0, 0)
    checkpoint = folder / "checkpoint"
    build_checkpoint(size, checkpoint)
    command = [sys.executable, "models/export.py", "--cache", "--checkpoint", str(checkpoint)]
    command += ["--exporter", "dynamo", "--dtype", "float16", "--out", str(folder / "export")]
    exported = measure("export", command)
    return onnx_path, exported


def external_data_bytes(model: Path) -> int:
    return sum(path.stat().st_size for path in model.parent.glob(f"{model.name}.data"))


def with_external_data(model: Path) -> None:
    """Moves a model's weights to external data, as every large export keeps them (models/export.py writes a model
    under 1.5 GB of weights inline)."""
    import onnx

    if external_data_bytes(model):
        return
    proto = onnx.load(str(model))
    onnx.save_model(
        proto, str(model), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{model.name}.data"
    )


def run(size: Size, folder: Path, repo: Path, commands: list[str]) -> list[Measured]:
    """The export (or its reuse), then each of `commands` (names of `COMMANDS`) with the trtfuse of `repo`."""
    original, exported = export(size, folder)
    with_external_data(original)
    fused = original.with_name("model.fused.onnx")
    fused.unlink(missing_ok=True)
    trtfuse = [sys.executable, "-m", "trtfuse.cli.main"]
    results = [exported, measure("fuse", [*trtfuse, "fuse", str(original), "-o", str(fused)], repo)]
    for name in commands:
        arguments = [part.format(original=original, fused=fused) for part in COMMANDS[name]]
        results.append(
            measure(" ".join(COMMANDS[name]).format(original="ORIG", fused="FUSED"), [*trtfuse, *arguments], repo)
        )
    return results


def table(results: list[Measured], weight_bytes: int) -> str:
    lines = ["| command | wall | CPU (user + sys) | peak RSS | RSS / weight bytes |", "|---|---|---|---|---|"]
    for result in results:
        if not result.peak_rss:
            continue
        ratio = result.peak_rss / weight_bytes
        failed = " (exit 1)" if result.exit_code else ""
        lines.append(
            f"| `{result.command}`{failed} | {result.seconds:.1f} s | {result.cpu_seconds:.1f} s | "
            f"{result.peak_rss / 1e9:.2f} GB | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--peak-rss-of"]:
        peak_rss_of(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full", help="full: 0.85 B parameters; small: 0.16 B")
    parser.add_argument("--keep", type=Path, help="Build in this folder and keep it (a later run reuses the export).")
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="Run the trtfuse of this checkout (another version, to compare)."
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(COMMANDS), help="Measure only these after fuse (repeatable)."
    )
    args = parser.parse_args()
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory(prefix="trtfuse-check-memory-") as temp:
        folder = args.keep or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        results = run(size, folder, args.repo.resolve(), args.only or list(COMMANDS))
        weight_bytes = external_data_bytes(folder / "export" / "checkpoint-dynamo-fp16-kv.onnx")
    print(
        f"Llama hidden {size.hidden}, {size.layers} layers, GQA {size.heads}/{size.kv_heads}, vocabulary {size.vocab}: "
        f"{size.parameters / 1e9:.2f} B parameters, {weight_bytes / 1e9:.2f} GB of fp16 external data"
    )
    print(table(results, weight_bytes))


if __name__ == "__main__":
    main()
