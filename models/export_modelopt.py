"""TensorRT Model Optimizer (nvidia-modelopt) on fp32 exports of the tiny models: Q/DQ quantization and AutoCast.

Runs in the modelopt virtual environment ($VENVS/modelopt, models/README.md; modelopt without its [onnx] extra). Each
model is first exported as export.py does (fp32; dynamo at opset 18 by default, `--source torchscript` for the
TorchScript exporter at opset 17, whose inverse root is `Sqrt -> Div(1, x)`; logits only, or with the KV cache as
optimum names it with `--cache`), or taken from optimum's fp32 KV-cache export in the same output folder
(`--source optimum`: `$EXPORTS/optimum/<arch>-optimum-fp32.onnx`, which export_optimum.py writes in its own venv;
calibrated as `--cache`), then given, as a user would, to `python -m modelopt.onnx.quantization` (int8 with fp16 and
with fp32 elsewhere, fp8, int4) and to `python -m modelopt.onnx.autocast` (fp16, bf16), calibrated on the CPU with
token ids inside the vocabulary (its own random calibration data indexes past a small vocabulary). The source's
metadata, which ModelOpt drops, is copied into each file. Files are named
`<arch>-modelopt-<variant>[-ts|-optimum][-kv].onnx`.

\b
    $VENVS/modelopt/bin/python models/export_modelopt.py --out $EXPORTS
    $VENVS/modelopt/bin/python models/export_modelopt.py --out $EXPORTS --source torchscript
    $VENVS/modelopt/bin/python models/export_modelopt.py --out $EXPORTS --cache --arch qwen3 --variant fp8
    $VENVS/modelopt/bin/python models/export_modelopt.py --out $EXPORTS --source optimum --arch olmo2
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime
from export import (
    EXPORTERS,
    VOCAB,
    CacheLayout,
    ExportSpec,
    LogitsOnly,
    WithCache,
    _feed,
    cache_layout,
    check_cache_steps,
    export_cache_onnx,
    export_onnx,
    random_input_ids,
)
from extras import exit_missing
from tool_exports import Manifest, export_facts, export_options, norm_entry, run_tool, tiny_model

try:
    import torch
except ModuleNotFoundError as missing:
    exit_missing(missing)

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
# The exporter of the fp32 source -> what it adds to the file tag (the dynamo files predate the option).
SOURCE_TAGS = {"dynamo": "", "torchscript": "-ts", "optimum": "-optimum"}
# A source another tool exported: optimum's fp32 KV-cache export, in its folder of the same output root.
OPTIMUM = "optimum"
# batch x tokens of the calibration data; with --cache, CALIBRATION_SHAPE[1] new tokens after as many cached ones.
CALIBRATION_SHAPE = (4, 16)
# onnxruntime's type string of a cache input -> the dtype export.py's KV check feeds it in.
CACHE_DTYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16}


def source_export(arch: str, exporter: str, cache: bool, folder: Path) -> Path:
    """export.py's fp32 export by `exporter` (with the KV cache if `cache`), or optimum's fp32 export beside the
    modelopt folder: the fp32 ONNX model a ModelOpt user starts from."""
    if exporter == OPTIMUM:
        path = folder.parent.parent / OPTIMUM / f"{arch}-optimum-fp32.onnx"
        if not path.exists():
            raise RuntimeError(f"{path} is missing: run export_optimum.py --arch {arch} --variant fp32 first")
        return path
    spec = ExportSpec(arch, exporter, "float32", cache=cache)
    path = folder / spec.filename
    if path.exists():
        return path
    model = tiny_model(arch, "float32")
    if cache:
        layout = cache_layout(model)
        export_cache_onnx(WithCache(model, len(layout.layers)).eval(), layout, spec, path, torch.float32)
    else:
        export_onnx(LogitsOnly(model).eval(), random_input_ids(2, 7, seed=0), spec, path)
    return path


def calibration_data(source: Path, layout: CacheLayout | None, folder: Path) -> Path:
    """Token ids inside the vocabulary; with a KV cache, a chunk of new tokens after a cached prefix, the prefix's
    keys and values being what the fp32 source computes for it (so the cache reads are calibrated on real ranges)."""
    path = folder / "calibration.npz"
    rng = np.random.default_rng(0)
    batch, tokens = CALIBRATION_SHAPE
    input_ids = rng.integers(0, VOCAB, (batch, tokens), dtype=np.int64)
    if layout is None:
        np.savez(path, input_ids=input_ids)
        return path
    session = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    empty = [tensor.numpy() for tensor in layout.past(batch, 0, torch.float32, seed=0)]
    _, *prefix = session.run(None, _feed(layout, torch.from_numpy(input_ids), empty))
    chunk = torch.from_numpy(rng.integers(0, VOCAB, (batch, tokens), dtype=np.int64))
    np.savez(path, **_feed(layout, chunk, prefix))
    return path


def one_batch(calibration: Path) -> str:
    """`--calibration_shapes` that make the whole calibration set one batch. TorchScript's masked attention scores
    hold float32's lowest value, and ModelOpt's histogram merge of a second batch (int8 and fp8 alike) computes
    that range in float32, where it overflows (`ValueError: Too many bins for data range`); one batch is never
    merged."""
    with np.load(calibration) as arrays:
        return ",".join(f"{name}:{'x'.join(map(str, arrays[name].shape))}" for name in arrays.files)


def copy_metadata(source: onnx.ModelProto, graph: onnx.ModelProto) -> None:
    """The source export's metadata_props, in `graph`, which ModelOpt writes without them: among them the positions
    the model was trained for (`max_position_embeddings`, export.py --cache), which trtfuse warns past. A key
    ModelOpt wrote itself keeps its value."""
    written = {entry.key for entry in graph.metadata_props}
    for entry in source.metadata_props:
        if entry.key not in written:
            graph.metadata_props.add(key=entry.key, value=entry.value)


def cache_facts(model: torch.nn.Module, layout: CacheLayout, graph: onnx.ModelProto, path: Path) -> dict[str, object]:
    """The KV interface of a quantized export, and onnxruntime's max rel error against the fp32 torch model at a
    prefill and a decode step (export.py's KV check; the quantization error, not a pass/fail)."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    types = {value.type for value in session.get_inputs() if value.name.startswith("past_key_values")}
    if len(types) != 1 or not types <= CACHE_DTYPES.keys():
        raise RuntimeError(f"{path.name}: past_key_values inputs of types {sorted(types)}, not one float type")
    dtype = CACHE_DTYPES[types.pop()]
    wrapper = WithCache(model, len(layout.layers)).eval()
    errors = check_cache_steps(wrapper, layout, session, dtype)
    return {
        "cache": layout.to_json(),
        "inputs": [value.name for value in graph.graph.input],
        "outputs": [value.name for value in graph.graph.output],
        "max_rel_error_vs_torch": {step: float(f"{error:.3g}") for step, error in errors.items()},
    }


def export(arch: str, variant: str, path: Path, sources: Path, exporter: str, cache: bool) -> dict[str, object]:
    dtype, module, options = VARIANTS[variant]
    model = tiny_model(arch, "float32")
    entry = norm_entry(model, arch, dtype, variant=variant)
    source = source_export(arch, exporter, cache, sources)
    layout = cache_layout(model) if cache else None
    with tempfile.TemporaryDirectory() as scratch:
        written = Path(scratch) / "model.onnx"
        calibration = calibration_data(source, layout, Path(scratch))
        command = [sys.executable, "-m", module, "--onnx_path", str(source), "--output_path", str(written), *options]
        if module == QUANTIZE:
            command += ["--calibration_data_path", str(calibration), "--calibration_eps", "cpu"]
            if exporter == "torchscript":
                command += ["--calibration_shapes", one_batch(calibration)]
        else:
            command += ["--calibration_data", str(calibration)]
        # ModelOpt iterates sets of tensor names in places (the order of the Casts it puts on the graph inputs):
        # a fixed hash seed makes the file byte-reproducible.
        run_tool(command, env={**os.environ, "PYTHONHASHSEED": "0"})
        graph = onnx.load(str(written))
        copy_metadata(onnx.load(str(source), load_external_data=False), graph)
        onnx.save(graph, str(path))
    entry["source"] = f"../{OPTIMUM}/{source.name}" if exporter == OPTIMUM else f"sources/{source.name}"
    if exporter != "dynamo":
        entry["source_exporter"] = exporter
    entry["qdq_nodes"] = sum(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in graph.graph.node)
    if layout is not None:
        entry |= cache_facts(model, layout, graph, path)
    return entry | export_facts(model, graph, path)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@export_options(VARIANTS)
@click.option(
    "--source",
    "exporter",
    type=click.Choice(sorted([*EXPORTERS, OPTIMUM])),
    default="dynamo",
    show_default=True,
    help="The exporter of the fp32 source model; torchscript tags the files `-ts`, optimum (its KV-cache export in "
    "OUT/optimum, calibrated as --cache) `-optimum`.",
)
@click.option("--cache", is_flag=True, help="Start from export.py's --cache export (KV cache); tags the files `-kv`.")
def main(
    out_root: Path,
    archs: tuple[str, ...],
    variants: tuple[str, ...],
    verbose: bool,
    force: bool,
    exporter: str,
    cache: bool,
) -> None:
    manifest = Manifest("modelopt", out_root / "modelopt", force=force)
    sources = manifest.out_dir / "sources"
    sources.mkdir(exist_ok=True)
    suffix = SOURCE_TAGS[exporter] + ("-kv" if cache else "")
    cache = cache or exporter == OPTIMUM
    manifest.attempt_all(
        archs,
        variants or VARIANTS,
        lambda arch, variant, path: export(arch, variant, path, sources, exporter, cache),
        verbose,
        tag=lambda variant: variant + suffix,
    )


if __name__ == "__main__":
    main()
