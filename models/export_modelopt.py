"""TensorRT Model Optimizer (nvidia-modelopt) on fp32 exports of the tiny models: Q/DQ quantization and AutoCast.

Runs in the modelopt virtual environment ($VENVS/modelopt, models/README.md; modelopt without its [onnx] extra).
Each model is first exported as export.py does (dynamo, opset 18, fp32, logits only), then given, as a user would,
to `python -m modelopt.onnx.quantization` (int8 with fp16 and with fp32 elsewhere, fp8, int4) and to `python -m
modelopt.onnx.autocast` (fp16, bf16), calibrated on the CPU with token ids inside the vocabulary (its own random
calibration data indexes past a small vocabulary).

\b
    $VENVS/modelopt/bin/python models/export_modelopt.py --out $EXPORTS
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
import numpy as np
import onnx
from export import VOCAB, ExportSpec, LogitsOnly, export_onnx, random_input_ids
from tool_exports import Manifest, export_facts, export_options, norm_entry, run_tool, tiny_model

QUANTIZE = "modelopt.onnx.quantization"
AUTOCAST = "modelopt.onnx.autocast"
# (file tag) -> (dtype outside the quantized ops, modelopt module, its options)
VARIANTS = {
    "int8-fp16": ("float16", QUANTIZE, ["--quantize_mode", "int8", "--high_precision_dtype", "fp16"]),
    "int8-fp32": ("float32", QUANTIZE, ["--quantize_mode", "int8", "--high_precision_dtype", "fp32"]),
    "fp8": ("float16", QUANTIZE, ["--quantize_mode", "fp8", "--high_precision_dtype", "fp16"]),
    "int4": ("float16", QUANTIZE, ["--quantize_mode", "int4", "--high_precision_dtype", "fp16"]),
    "autocast-fp16": ("float16", AUTOCAST, ["--low_precision_type", "fp16"]),
    "autocast-bf16": ("bfloat16", AUTOCAST, ["--low_precision_type", "bf16"]),
}
CALIBRATION_SHAPE = (4, 16)


def source_export(arch: str, folder: Path) -> Path:
    """export.py's dynamo fp32 export: the fp32 ONNX model a ModelOpt user starts from."""
    path = folder / f"{arch}-dynamo-fp32.onnx"
    if not path.exists():
        export_onnx(LogitsOnly(tiny_model(arch, "float32")).eval(), random_input_ids(2, 7, seed=0),
                    ExportSpec(arch, "dynamo", "float32"), path)  # fmt: skip
    return path


def calibration_data(folder: Path) -> Path:
    path = folder / "calibration.npz"
    rng = np.random.default_rng(0)
    np.savez(path, input_ids=rng.integers(0, VOCAB, CALIBRATION_SHAPE, dtype=np.int64))
    return path


def export(arch: str, variant: str, path: Path, sources: Path) -> dict[str, object]:
    dtype, module, options = VARIANTS[variant]
    model = tiny_model(arch, "float32")
    entry = norm_entry(model, arch, dtype, variant=variant)
    source = source_export(arch, sources)
    with tempfile.TemporaryDirectory() as scratch:
        written = Path(scratch) / "model.onnx"
        command = [sys.executable, "-m", module, "--onnx_path", str(source), "--output_path", str(written), *options]
        if module == QUANTIZE:
            command += ["--calibration_data_path", str(calibration_data(Path(scratch))), "--calibration_eps", "cpu"]
        else:
            command += ["--calibration_data", str(calibration_data(Path(scratch)))]
        run_tool(command)
        graph = onnx.load(str(written))
        onnx.save(graph, str(path))
    entry["source"] = f"sources/{source.name}"
    entry["qdq_nodes"] = sum(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in graph.graph.node)
    return entry | export_facts(model, graph, path)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@export_options(VARIANTS)
def main(out_root: Path, archs: tuple[str, ...], variants: tuple[str, ...], verbose: bool) -> None:
    manifest = Manifest("modelopt", out_root / "modelopt")
    sources = manifest.out_dir / "sources"
    sources.mkdir(exist_ok=True)
    manifest.attempt_all(
        archs, variants or VARIANTS, lambda arch, variant, path: export(arch, variant, path, sources), verbose
    )


if __name__ == "__main__":
    main()
