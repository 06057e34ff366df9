"""torch.onnx's dynamo exporter at opset 23, where RMSNorm modules become `RMSNormalization` nodes.

Runs in the project's own environment (`pip install -e '.[export]'`): fp32, fp16 and bf16 logits-only exports of
the tiny models, into OUT/dynamo23/ with an expected.json of their norm-module calls.

\b
    python models/export_dynamo23.py --out $EXPORTS
    python models/export_dynamo23.py --out /tmp/e --arch gemma3 --dtype bfloat16
"""

from __future__ import annotations

import warnings
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime
from export import CHECK_SHAPE, STACK_TRACE_KEY, LogitsOnly, random_input_ids
from extras import exit_missing
from tool_exports import FORCE_OPTION, Manifest, first_line, norm_entry, tiny_model

try:
    import torch
except ModuleNotFoundError as missing:
    exit_missing(missing)

OPSET = 23
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TAGS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def export(arch: str, dtype: str, path: Path) -> dict[str, object]:
    model = tiny_model(arch, "float32").to(DTYPES[dtype])
    entry = norm_entry(model, arch, dtype, variant=f"opset{OPSET}", opset=OPSET)
    wrapper = LogitsOnly(model).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    sequence = torch.export.Dim("sequence", min=1, max=128)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            wrapper,
            (random_input_ids(2, 7, seed=0),),
            dynamo=True,
            opset_version=OPSET,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_shapes={"input_ids": {0: batch, 1: sequence}},
        )
    program.save(str(path), external_data=False)
    graph = onnx.load(str(path))
    for node in graph.graph.node:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(graph, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
    # onnx's own type inference rejects some files the exporter writes; the file is kept and the message recorded.
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        entry["checker"] = first_line(error)
    entry["rms_normalization_nodes"] = sum(node.op_type == "RMSNormalization" for node in graph.graph.node)
    entry["onnxruntime_vs_torch"] = onnxruntime_error(wrapper, path)
    entry["bytes"] = path.stat().st_size
    return entry


def onnxruntime_error(wrapper: torch.nn.Module, path: Path) -> str:
    """Max rel error of onnxruntime's logits against torch's at batch 1 (its RotaryEmbedding runs only there)."""
    input_ids = random_input_ids(1, CHECK_SHAPE[1], seed=1)
    with torch.no_grad():
        expected = wrapper(input_ids).float().numpy()
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (logits,) = session.run(None, {"input_ids": input_ids.numpy()})
    except Exception as error:  # onnxruntime cannot load some of these files at all; that is a finding, not a stop
        return f"onnxruntime fails: {first_line(error)}"
    logits = np.asarray(logits, dtype=np.float32)
    return f"{np.abs(logits - expected).max() / np.abs(expected).max():.2e}"


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out_root", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--arch", "archs", multiple=True, help="Only these families (repeatable).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(sorted(DTYPES)))
@click.option("--verbose", is_flag=True, help="Print the full traceback of a failed export.")
@FORCE_OPTION
def main(out_root: Path, archs: tuple[str, ...], dtypes: tuple[str, ...], verbose: bool, force: bool) -> None:
    manifest = Manifest("dynamo23", out_root / "dynamo23", force=force)
    manifest.attempt_all(archs, dtypes or DTYPES, export, verbose, TAGS.get)


if __name__ == "__main__":
    main()
