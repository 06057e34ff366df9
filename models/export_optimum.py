"""Hugging Face optimum-onnx exports with a KV cache (`text-generation-with-past`) of the tiny models.

Runs in the optimum virtual environment ($VENVS/optimum, models/README.md: optimum-onnx 0.1 needs transformers <
4.58). Each model is saved with `save_pretrained` and exported by `optimum-cli export onnx`, as a user would, in
fp32 and fp16, and with `--optimize O2` (onnxruntime's transformer fusions) where optimum accepts the architecture.
bf16 is tried too.

\b
    $VENVS/optimum/bin/python models/export_optimum.py --out $EXPORTS
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
import onnx
from tool_exports import (
    Manifest,
    export_facts,
    export_options,
    norm_entry,
    run_tool,
    save_checkpoint,
    tiny_model,
)

TASK = "text-generation-with-past"
# (file tag, optimum-cli options); fp16/bf16 export on the CPU is what a user without a GPU gets.
VARIANTS = {
    "fp32": ("float32", []),
    "fp16": ("float16", ["--dtype", "fp16"]),
    "bf16": ("bfloat16", ["--dtype", "bf16"]),
    "fp32-O2": ("float32", ["--optimize", "O2"]),
    "fp16-O2": ("float16", ["--dtype", "fp16", "--optimize", "O2"]),
}


def export(arch: str, variant: str, path: Path) -> dict[str, object]:
    dtype, options = VARIANTS[variant]
    model = tiny_model(arch, "float32")
    entry = norm_entry(model, arch, dtype, variant=variant, task=TASK)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "checkpoint"
        save_checkpoint(model, checkpoint)
        exported = Path(scratch) / "onnx"
        cli = Path(sys.executable).with_name("optimum-cli")
        command = [str(cli), "export", "onnx", "-m", str(checkpoint), "--task", TASK, *options, str(exported)]
        run_tool(command)
        onnx_files = sorted(exported.glob("*.onnx"))
        if len(onnx_files) != 1:
            raise RuntimeError(f"expected one .onnx file, optimum wrote {[p.name for p in onnx_files]}")
        graph = onnx.load(str(onnx_files[0]))
        onnx.save(graph, str(path))
    entry["inputs"] = [value.name for value in graph.graph.input]
    return entry | export_facts(model, graph, path)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@export_options(VARIANTS)
def main(out_root: Path, archs: tuple[str, ...], variants: tuple[str, ...], verbose: bool, force: bool) -> None:
    Manifest("optimum", out_root / "optimum", force=force).attempt_all(archs, variants or VARIANTS, export, verbose)


if __name__ == "__main__":
    main()
