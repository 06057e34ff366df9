"""What `polygraphy run` would fail at in its own runner, seen from the model before any runner starts: a model that
holds trtfuse plugin nodes given to `--onnxrt` (onnxruntime has no kernel for them), and a model whose dynamic dims
cannot all be 1, the size Polygraphy gives every dynamic dim `--input-shapes` leaves out (a KV-cache export's
attention mask spans past + new tokens; genai's cache head size is fixed by its attention op). Each problem is one
line saying what to use instead; `args.TrtfuseArgs` prints it as Polygraphy prints a bad argument."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from google.protobuf.message import DecodeError

from trtfuse.errors import TrtfuseError
from trtfuse.fusion.fused_nodes import plugin_node_counts
from trtfuse.model.dims import DimExpressionError, ModelDims, model_dims
from trtfuse.model.feeds import DECODE, SINGLE, make_feed

# Polygraphy's runner options this module knows the failure of.
ONNXRT_RUNNER = "onnxrt"
# The size Polygraphy's data loader gives a dynamic dim (polygraphy.constants.DEFAULT_SHAPE_VALUE).
POLYGRAPHY_DIM = 1


def run_problem(model_path: str, runners: Sequence[str], shapes_given: bool) -> str | None:
    """The first problem `polygraphy run` would meet running `runners` on the model, or None (also where the model
    cannot be read: the runners then say so in their own words). `shapes_given`: --input-shapes, --load-inputs or a
    data loader script sizes the inputs, not Polygraphy's fill."""
    try:
        model = onnx.load(model_path, load_external_data=False)
        reading = model_dims(model)
    except (OSError, DecodeError, TrtfuseError):
        return None
    if ONNXRT_RUNNER in runners:
        problem = _onnxrt_problem(model, model_path)
        if problem is not None:
            return problem
    return None if shapes_given else _shape_problem(model, reading, model_path)


def _onnxrt_problem(model: onnx.ModelProto, source: str) -> str | None:
    """One line for a model with trtfuse plugin nodes, which `--onnxrt` cannot load, else None."""
    nodes = sum(plugin_node_counts(model).values())
    if not nodes:
        return None
    return (
        f"{source} holds {nodes} trtfuse plugin node{'s' if nodes != 1 else ''}, which --onnxrt cannot run "
        "(onnxruntime has no kernel for them); use --trtfuse-onnxrt, which runs them lowered to standard ops, or give "
        "--onnxrt the original model"
    )


def _shape_problem(model: onnx.ModelProto, reading: ModelDims, source: str) -> str | None:
    """One line for a model whose dynamic dims, each 1, do not agree with its dims, with --input-shapes that do;
    else None."""
    found = _first_disagreement(reading)
    if found is None:
        return None
    name, axis, text, required = found
    problem = (
        f"{source}: Polygraphy gives every dynamic dim --input-shapes leaves out the size {POLYGRAPHY_DIM}, but the "
        f"model needs dim {axis} of input {name!r} ({text!r}) to be {required} then"
    )
    example = _example_shapes(model, reading)
    if example is None:
        return f"{problem}; give --input-shapes for every input, sizes that agree"
    return f"{problem}; give --input-shapes that agree, e.g. --input-shapes {example}"


def _first_disagreement(reading: ModelDims) -> tuple[str, int, str, int] | None:
    """The first input dim whose value, every symbol 1 but those the graph fixes, is not 1."""
    symbols = {s for parsed in reading.expressions.values() for e in parsed if e is not None for s in e.symbols}
    values = {symbol: POLYGRAPHY_DIM for symbol in symbols}
    values.update({symbol: bound.value for symbol, bound in reading.fixed.items()})
    for value in reading.inputs:
        for axis, expression in enumerate(reading.expressions[value.name]):
            if expression is None:
                continue
            try:
                required = expression.evaluate(values)
            except DimExpressionError:
                continue
            if required != POLYGRAPHY_DIM:
                return value.name, axis, expression.text, required
    return None


def _example_shapes(model: onnx.ModelProto, reading: ModelDims) -> str | None:
    """Polygraphy's --input-shapes of `trtfuse check`'s decode step (its one step of a model without a cache), or
    None where trtfuse cannot size the inputs either."""
    try:
        feed = make_feed(model, seed=0, step=DECODE if reading.has_kv_cache else SINGLE)
    except TrtfuseError:
        return None
    return " ".join(f"{name}:[{','.join(str(dim) for dim in array.shape)}]" for name, array in feed.items())
