"""Numerical check of a fused model against its original, both run by onnxruntime on the CPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import external_data_helper, helper

from trtfuse.errors import MissingDependencyError, TrtfuseError, first_line
from trtfuse.inputs import make_feed
from trtfuse.io import LoadedModel
from trtfuse.reference import lower_fused_nodes
from trtfuse.tolerances import OutputError, output_error

# onnxruntime resolves external data of a model given as bytes against this folder.
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class CheckResult:
    """Per-output errors of the fused model against the original on the same inputs."""

    errors: list[OutputError]

    @property
    def passed(self) -> bool:
        return all(error.passed for error in self.errors)


def onnxruntime_session(model: LoadedModel) -> object:
    """An onnxruntime CPU session running `model` as written: no graph optimisations, which would fuse and re-round
    the very norm chains being checked. External data resolves against the model's own folder."""
    try:
        import onnxruntime
    except ImportError:
        raise MissingDependencyError("onnxruntime is not installed: pip install onnxruntime") from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(model.path.resolve().parent))
    try:
        return onnxruntime.InferenceSession(
            model.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as error:
        # onnxruntime raises its own exception types for unsupported ops and bad graphs alike.
        raise TrtfuseError(f"{model.path}: onnxruntime cannot load it: {first_line(error)}") from None


def run_model(model: LoadedModel, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime, or for bfloat16 models, which onnxruntime's CPU kernels mostly lack, onnx's reference evaluator."""
    if uses_bfloat16(model.model):
        return run_reference_evaluator(model, feed)
    return run_onnxruntime(model, feed)


def uses_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether any graph input, output, value, initializer or Cast of the main graph is bfloat16."""
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    bf16 = onnx.TensorProto.BFLOAT16
    return (
        any(value.type.tensor_type.elem_type == bf16 for value in values)
        or any(tensor.data_type == bf16 for tensor in graph.initializer)
        or any(node.op_type == "Cast" and helper.get_node_attr_value(node, "to") == bf16 for node in graph.node)
    )


def run_reference_evaluator(model: LoadedModel, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `model` with `onnx.reference.ReferenceEvaluator`: exact per-op rounding in every dtype, slow, CPU only."""
    from onnx.reference import ReferenceEvaluator

    proto = onnx.ModelProto()
    proto.CopyFrom(model.model)
    external_data_helper.load_external_data_for_model(proto, str(model.path.resolve().parent))
    try:
        evaluator = ReferenceEvaluator(proto)
        names = list(evaluator.output_names)
        return dict(zip(names, evaluator.run(names, dict(feed)), strict=True))
    except Exception as error:
        # The evaluator raises whatever its op implementations raise.
        raise TrtfuseError(f"{model.path}: onnx's reference evaluator cannot run it: {first_line(error)}") from None


def run_onnxruntime(model: LoadedModel, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `model` on `feed` with `onnxruntime_session`."""
    session = onnxruntime_session(model)
    names = [output.name for output in session.get_outputs()]
    try:
        return dict(zip(names, session.run(names, dict(feed)), strict=True))
    except Exception as error:
        # onnxruntime raises its own exception types for unsupported ops, bad graphs and bad feeds alike.
        raise TrtfuseError(f"{model.path}: onnxruntime cannot run it: {first_line(error)}") from None


def check_fused(
    original: LoadedModel,
    fused: LoadedModel,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> CheckResult:
    """Feed both models the same random inputs (the fused one with its plugin nodes lowered) and compare outputs."""
    feed = make_feed(original.model, seed, shapes=shapes, dims=dims)
    _check_same_interface(original, fused)
    reference_outputs = run_model(original, feed)
    lowered = LoadedModel(model=lower_fused_nodes(fused.model), path=fused.path)
    fused_outputs = run_model(lowered, feed)
    errors = [output_error(name, fused_outputs[name], reference) for name, reference in reference_outputs.items()]
    return CheckResult(errors=errors)


def _check_same_interface(original: LoadedModel, fused: LoadedModel) -> None:
    def names(values: Sequence[onnx.ValueInfoProto], model: onnx.ModelProto) -> set[str]:
        initializers = {tensor.name for tensor in model.graph.initializer}
        return {value.name for value in values if value.name not in initializers}

    for kind, original_names, fused_names in (
        ("inputs", names(original.model.graph.input, original.model), names(fused.model.graph.input, fused.model)),
        ("outputs", names(original.model.graph.output, original.model), names(fused.model.graph.output, fused.model)),
    ):
        if original_names != fused_names:
            difference = ", ".join(sorted(original_names ^ fused_names))
            raise TrtfuseError(f"{fused.path}: graph {kind} differ from {original.path}'s: {difference}")
