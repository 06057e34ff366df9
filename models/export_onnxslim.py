"""onnxslim on the other tools' exports: the same models after its constant folding and graph rewrites.

Runs in the optimum virtual environment ($VENVS/optimum) (which has onnxslim), after export_optimum.py and
export_dynamo23.py: every optimum fp32/fp16 export and every fp16/bf16 opset-23 dynamo export under OUT is passed
through `onnxslim.slim(IN, OUT)` (what `onnxslim IN OUT` runs) into OUT/onnxslim/. The expected counts are the
source's (onnxslim changes no module).

\b
    $VENVS/optimum/bin/python models/export_onnxslim.py --out $EXPORTS
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import onnx
from tool_exports import FORCE_OPTION, Manifest

# Source tool -> the variants of its files that are slimmed.
SOURCES = {"optimum": ("fp32", "fp16"), "dynamo23": ("fp16", "bf16")}


def slim(source: Path, entry: dict[str, object], path: Path) -> dict[str, object]:
    # Only the optimum venv has onnxslim; imported here so that `-h` works in any python.
    import onnxslim

    # The library call behind the `onnxslim IN OUT` command line, without a process start per file.
    onnxslim.slim(str(source), str(path))
    graph = onnx.load(str(path))
    # add_norm_calls only where the source's manifest has it (exports made before the add-norm do not).
    keys = ("architecture", "dtype", "epsilon", "norm_calls", "qk_norm_calls", "add_norm_calls", "uses_rms_norm")
    kept = {key: entry[key] for key in keys if key in entry}
    return {
        **kept,
        "variant": f"{entry['tool']}-{entry['variant']}",
        "source": f"{source.parent.name}/{source.name}",
        "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
        "bytes": path.stat().st_size,
    }


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out_root", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--verbose", is_flag=True, help="Print the full traceback of a failed run.")
@FORCE_OPTION
def main(out_root: Path, verbose: bool, force: bool) -> None:
    manifest = Manifest("onnxslim", out_root / "onnxslim", force=force)
    jobs = {}
    for tool, variants in SOURCES.items():
        listing = out_root / tool / "expected.json"
        if not listing.exists():
            print(f"skipped {tool}: {listing} does not exist (run its script first)")
            continue
        for name, entry in sorted(json.loads(listing.read_text())["files"].items()):
            if name.endswith(tuple(f"-{variant}.onnx" for variant in variants)):
                jobs[name.replace(".onnx", "-slim.onnx")] = (listing.parent / name, entry)
    manifest.check(list(jobs))
    for slimmed, (source, entry) in jobs.items():
        path = manifest.out_dir / slimmed
        manifest.attempt(slimmed, lambda s=source, e=entry, p=path: slim(s, e, p), verbose)
    manifest.write()


if __name__ == "__main__":
    main()
