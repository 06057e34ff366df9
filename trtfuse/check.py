"""Numerical check of a fused model against its original, both run on the CPU, judged by `trtfuse.verdict`.

Each step's feed (a prefill and a decode step on KV-cache models, `trtfuse.inputs.default_feeds`) goes to the original
twice, to the candidate once and, for 16-bit and quantized graphs, to a float32 evaluation of the original graph
(`trtfuse.widening`). `trtfuse compare` runs the same `judge_steps` with a TensorRT engine as the candidate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper

from trtfuse import contract
from trtfuse.errors import MissingDependencyError, TrtfuseError, first_line
from trtfuse.inputs import StepFeed, default_feeds
from trtfuse.io import DEFAULT_DOMAINS, LoadedModel
from trtfuse.reference import lower_fused_nodes
from trtfuse.tolerances import Tolerance, tolerance_for
from trtfuse.verdict import REFERENCE_MARGIN, Judge, OutputVerdict
from trtfuse.widening import NARROW_FLOATS, is_reduced_precision, widen_to_float32

# onnxruntime resolves external data of a model given as bytes against this folder.
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
# onnxruntime's messages about a feed the graph cannot take; the sizes are what the user can change.
_SHAPE_ERROR = re.compile(r"shape|dimension|rank|broadcast|reshape|size", re.IGNORECASE)
_SIZE_HINT = "; set the input sizes with --dim SYMBOL=N or --shape NAME=D0xD1"
_FLOAT_OUTPUTS = {"float16", "bfloat16", "float32", "float64"}


@dataclass(frozen=True)
class StepResult:
    """The verdict on every output of the original at one step; an output left out has `passed` None."""

    name: str
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[OutputVerdict]
    notes: tuple[str, ...] = ()

    @property
    def judged(self) -> list[OutputVerdict]:
        return [output for output in self.outputs if output.passed is not None]

    @property
    def passed(self) -> bool:
        return bool(self.judged) and all(output.passed for output in self.judged)


@dataclass(frozen=True)
class CheckResult:
    """Every step's verdicts; `seed` is None when the inputs came from a file."""

    steps: list[StepResult]
    seed: int | None
    inputs_file: Path | None = None
    judged_by: str = "tolerance"

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(step.passed for step in self.steps)

    @property
    def errors(self) -> list[OutputVerdict]:
        return [output for step in self.steps for output in step.outputs]

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "inputs_file": str(self.inputs_file) if self.inputs_file else None,
            "judged_by": self.judged_by,
            "margin": REFERENCE_MARGIN,
            "steps": [
                {
                    "step": step.name,
                    "input_shapes": {name: list(shape) for name, shape in step.input_shapes.items()},
                    "notes": list(step.notes),
                    "passed": step.passed,
                    "outputs": [output.to_json() for output in step.outputs],
                }
                for step in self.steps
            ],
        }


def onnxruntime_session(model: LoadedModel) -> object:
    """An onnxruntime CPU session running `model` as written: no graph optimisations, which would fuse and re-round
    the very norm chains being checked. External data resolves as `trtfuse.io.load_model` resolves it: against the
    folder the model's path names, not the target of a symlinked model file."""
    try:
        import onnxruntime
    except ImportError:
        raise MissingDependencyError("onnxruntime is not installed: pip install onnxruntime") from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Errors come back as exceptions, each turned into one line; onnxruntime's own log would repeat them.
    options.log_severity_level = 4
    options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(model.path.absolute().parent))
    try:
        return onnxruntime.InferenceSession(
            model.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as error:
        # onnxruntime raises its own exception types for unsupported ops and bad graphs alike.
        raise TrtfuseError(f"{model.path}: onnxruntime cannot load it: {first_line(error)}") from None


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


class ModelRunner:
    """One model on the CPU, loaded once and run on any number of feeds: onnxruntime, or onnx's reference evaluator
    (exact per-op rounding, slow) for bfloat16 models, which onnxruntime's CPU kernels mostly lack, and where asked."""

    def __init__(self, model: LoadedModel, evaluator: bool = False) -> None:
        self.model = model
        self.evaluator = evaluator or uses_bfloat16(model.model)
        self._run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    def load(self) -> ModelRunner:
        if self._run is None:
            self._run = self._evaluator() if self.evaluator else self._onnxruntime()
        return self

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.load()._run(feed)

    def _onnxruntime(self) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        session = onnxruntime_session(
            LoadedModel(model=_as_onnxruntime_runs_it(self.model.model), path=self.model.path)
        )
        # The model's own outputs, not those `keep_16_bit_roundings` adds.
        names = [output.name for output in self.model.model.graph.output]

        def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
                return dict(zip(names, session.run(names, dict(feed)), strict=True))
            except Exception as error:
                # onnxruntime raises its own exception types for unsupported ops, bad graphs and bad feeds alike.
                message = first_line(error)
                raise TrtfuseError(f"{self.model.path}: onnxruntime cannot run it: {message}{_hint(message)}") from None

        return run

    def _evaluator(self) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        from onnx.reference import ReferenceEvaluator

        proto = onnx.ModelProto()
        proto.CopyFrom(self.model.model)
        external_data_helper.load_external_data_for_model(proto, str(self.model.path.absolute().parent))
        try:
            evaluator = ReferenceEvaluator(proto)
        except Exception as error:
            # The evaluator raises whatever its op implementations raise.
            message = f"onnx's reference evaluator cannot load it: {first_line(error)}"
            raise TrtfuseError(f"{self.model.path}: {message}") from None
        names = list(evaluator.output_names)

        def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
                return dict(zip(names, evaluator.run(names, dict(feed)), strict=True))
            except Exception as error:
                message = f"onnx's reference evaluator cannot run it: {first_line(error)}"
                raise TrtfuseError(f"{self.model.path}: {message}{_hint(message)}") from None

        return run


def _as_onnxruntime_runs_it(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its recorded intermediate shapes, which onnxruntime infers itself (an exporter's stale ones,
    such as genai's `sequence_length` where a decode step has the total length, make it re-use a buffer of the wrong
    size), and with its 16-bit roundings kept."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    return keep_16_bit_roundings(bare)


def keep_16_bit_roundings(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with an Identity after every node output of a 16-bit float type, each also a graph output, so that
    onnxruntime rounds every 16-bit value as the graph says (as TensorRT does).

    onnxruntime's CPU build runs fp16 ops it has no fp16 kernel for (Pow, ReduceMean, Sqrt, Mul...) in float32 between
    casts it inserts, and removes each fp32 -> fp16 -> fp32 cast pair that results, rounding included: an fp16 graph
    then runs nearly in float32, and a fused node, which rounds where the contract says, looks worse than the original
    by up to 1.8x against the float32 evaluation (measured on ModelOpt AutoCast fp16 exports). An Identity alone keeps
    the rounding only after an explicit Cast: onnxruntime turns an Identity between two float32-run ops into float32
    too, unless its value is a graph output, which must be fp16. Measured: exact per-op fp16 rounding of a
    Pow -> ReduceMean -> Sqrt -> Div chain with both, float32 throughout with either alone.
    """
    if not is_reduced_precision(model):
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        # Shape inference raises on graphs onnxruntime still runs; they run without the kept roundings.
        return model
    narrow = {
        value.name: value
        for value in [*inferred.value_info, *inferred.output]
        if value.type.tensor_type.elem_type in NARROW_FLOATS
    }
    kept = onnx.ModelProto()
    kept.CopyFrom(model)
    outputs = {value.name for value in kept.graph.output}
    nodes = []
    for node in kept.graph.node:
        nodes.append(node)
        if node.op_type in ("Identity", "Constant"):
            continue
        for index, output in enumerate(node.output):
            if output in narrow:
                node.output[index] = f"{output}/before_rounding"
                nodes.append(helper.make_node("Identity", [node.output[index]], [output], name=f"{output}/rounding"))
                if output not in outputs:
                    kept.graph.output.append(narrow[output])
    del kept.graph.node[:]
    kept.graph.node.extend(nodes)
    return kept


def _hint(message: str) -> str:
    """Where a runtime's error is about the sizes fed (not about types), what the user can change."""
    return _SIZE_HINT if _SHAPE_ERROR.search(message) and "type" not in message.lower() else ""


def run_model(model: LoadedModel, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`model`'s outputs on `feed`, once."""
    return ModelRunner(model).run(feed)


def check_fused(
    original: LoadedModel,
    fused: LoadedModel,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    tolerance: Tolerance | None = None,
    feeds: Sequence[StepFeed] | None = None,
    inputs_file: Path | None = None,
) -> CheckResult:
    """Judge `fused`, its plugin nodes lowered to standard ops, against `original` at each of `feeds` (by default
    `default_feeds` of the original with `seed`, `shapes` and `dims`; `inputs_file` names where given feeds came from).
    """
    check_same_inputs(original, fused)
    check_fused_nodes(fused)
    try:
        lowered_model = lower_fused_nodes(fused.model)
    except TrtfuseError as error:
        raise TrtfuseError(f"{fused.path}: {error}") from None
    for output in lowered_model.graph.output:
        if output.type.HasField("tensor_type") and not output.type.tensor_type.elem_type:
            # onnxruntime refuses an undefined output dtype but infers a missing type: the output still runs, and
            # `declared_output_differences` fails it.
            output.ClearField("type")
    runner, note = original_runner(original)
    lowered = ModelRunner(LoadedModel(model=lowered_model, path=fused.path), evaluator=runner.evaluator)
    judge = judge_for(original, tolerance, *declared_output_differences(original, fused))
    if feeds is None:
        feeds = default_feeds(original.model, seed, shapes=shapes, dims=dims)
    return judge_steps(runner, lowered.run, feeds, judge, None if inputs_file else seed, inputs_file, note)


def judge_for(
    original: LoadedModel,
    tolerance: Tolerance | None,
    declared: Mapping[str, str] | None = None,
    remarks: Mapping[str, str] | None = None,
) -> Judge:
    check_comparable_outputs(original)
    return Judge(tolerance, computed_dtypes(original.model), declared or {}, remarks or {})


def original_runner(original: LoadedModel) -> tuple[ModelRunner, str]:
    """The original's runner, and a note when it is not onnxruntime: where onnxruntime cannot load a model (dynamo's
    opset-23 fp16 Gemma3 mixes fp16 and fp32 in one Mul), onnx's reference evaluator runs it, and the fused model with
    it."""
    runner = ModelRunner(original)
    try:
        return runner.load(), ""
    except TrtfuseError as error:
        if runner.evaluator:
            raise
        note = f"{error}; both models run in onnx's reference evaluator instead"
        return ModelRunner(original, evaluator=True).load(), note


def judge_steps(
    runner: ModelRunner,
    run_candidate: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    feeds: Sequence[StepFeed],
    judge: Judge,
    seed: int | None,
    inputs_file: Path | None = None,
    note: str = "",
) -> CheckResult:
    """Run the original (`runner`) twice, the candidate once and, where the verdict uses it, the float32 evaluation
    of the original, at every step; judge each output. `note` goes with every step."""
    original = runner.model
    reference = _reference_runner(original) if judge.tolerance is None else None
    steps = []
    for step in feeds:
        first = runner.run(step.feed)
        _check_tensor_outputs(original, first)
        again = runner.run(step.feed)
        candidate = run_candidate(step.feed)
        notes = [note] if note else []
        expected = None
        if reference is not None:
            try:
                expected = reference.run(_widened_feed(step.feed))
            except TrtfuseError as error:
                notes.append(f"no float32 evaluation of the original ({error}): judged by tolerance")
        steps.append(
            StepResult(
                name=step.step,
                input_shapes={name: tuple(array.shape) for name, array in step.feed.items()},
                outputs=judge.outputs(first, again, candidate, expected),
                notes=tuple(notes),
            )
        )
    judged_by = "float32 evaluation" if reference is not None else "tolerance"
    return CheckResult(steps=steps, seed=seed, inputs_file=inputs_file, judged_by=judged_by)


def _reference_runner(original: LoadedModel) -> ModelRunner | None:
    if not is_reduced_precision(original.model):
        return None
    return ModelRunner(LoadedModel(model=widen_to_float32(original.model), path=original.path))


def _widened_feed(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    narrow = {np.dtype(helper.tensor_dtype_to_np_dtype(elem)) for elem in NARROW_FLOATS}
    return {name: array.astype(np.float32) if array.dtype in narrow else array for name, array in feed.items()}


def computed_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """Per graph output, the dtype of the computation that produced it: the loosest float dtype along the Casts and
    Identities it comes out of (an fp16 model's `logits.float()` is float16's)."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        # Shape inference raises for graphs onnxruntime still runs; each output then keeps its own dtype.
        graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type for value in [*graph.input, *graph.value_info]}
    types.update({value.name: value.type.tensor_type.elem_type for value in graph.output})
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    producers = {output: node for node in graph.node for output in node.output}
    computed = {}
    for output in graph.output:
        chain = [output.name]
        node = producers.get(output.name)
        while node is not None and node.op_type in ("Cast", "Identity") and node.domain in DEFAULT_DOMAINS:
            chain.append(node.input[0])
            node = producers.get(node.input[0])
        names = [_dtype_name(types[name]) for name in chain if types.get(name)]
        floats = [name for name in names if name in _FLOAT_OUTPUTS]
        if floats:
            computed[output.name] = max(floats, key=lambda name: tolerance_for(name).rtol)
        elif names:
            computed[output.name] = names[-1]
    return computed


def _dtype_name(elem_type: int) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def check_comparable_outputs(model: LoadedModel) -> None:
    """Every graph output must be a tensor of numbers or bools: a string, complex or non-tensor output has no error
    to measure."""
    for output in model.model.graph.output:
        kind = output.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise TrtfuseError(
                f"{model.path}: output '{output.name}' is a {kind.removesuffix('_type')}, not a tensor; "
                "check compares tensor outputs only"
            )
        elem_type = output.type.tensor_type.elem_type
        if elem_type in (onnx.TensorProto.STRING, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            kind = onnx.TensorProto.DataType.Name(elem_type).lower()
            raise TrtfuseError(
                f"{model.path}: output '{output.name}' holds {kind} values; "
                "check compares numeric and bool outputs only"
            )


def _check_tensor_outputs(model: LoadedModel, outputs: Mapping[str, object]) -> None:
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray) or (value.dtype.kind not in "biuf" and value.dtype.name != "bfloat16"):
            kind = value.dtype.name if isinstance(value, np.ndarray) else type(value).__name__
            raise TrtfuseError(
                f"{model.path}: output '{name}' came out as {kind}; check compares numeric and bool tensors only"
            )


def check_same_inputs(original: LoadedModel, fused: LoadedModel) -> None:
    """The two models must take the same inputs, of the same dtypes, and give the same outputs by name."""
    original_inputs = _interface(original.model.graph.input, original.model)
    fused_inputs = _interface(fused.model.graph.input, fused.model)
    original_outputs = _interface(original.model.graph.output, original.model)
    fused_outputs = _interface(fused.model.graph.output, fused.model)
    for kind, original_names, fused_names in (
        ("inputs", set(original_inputs), set(fused_inputs)),
        ("outputs", set(original_outputs), set(fused_outputs)),
    ):
        if original_names != fused_names:
            difference = ", ".join(sorted(original_names ^ fused_names))
            raise TrtfuseError(f"{fused.path}: graph {kind} differ from {original.path}'s: {difference}")
    for name, value in original_inputs.items():
        if _type_text(value) != _type_text(fused_inputs[name]):
            raise TrtfuseError(
                f"{fused.path}: input '{name}' is {_type_text(fused_inputs[name])}, in {original.path} "
                f"{_type_text(value)}"
            )


def declared_output_differences(original: LoadedModel, fused: LoadedModel) -> tuple[dict[str, str], dict[str, str]]:
    """Per output, what the fused model changed in its declared type: changes that fail it (no dtype, another dtype,
    rank or static dim) and changes that do not (a symbolic dim renamed or made static, as shape inference in the
    pass may do: the graph computes the same values, and its numbers are still judged)."""
    fused_outputs = _interface(fused.model.graph.output, fused.model)
    failures, remarks = {}, {}
    for name, value in _interface(original.model.graph.output, original.model).items():
        declared, candidate = value.type.tensor_type, fused_outputs[name].type.tensor_type
        change = f"declared {_type_text(fused_outputs[name])} in the fused model, {_type_text(value)} originally"
        if declared.elem_type and not candidate.elem_type:
            failures[name] = "the fused model declares no dtype for it"
        elif declared.elem_type != candidate.elem_type or not _same_static_dims(declared, candidate):
            failures[name] = change
        elif declared.HasField("shape") and _type_text(value) != _type_text(fused_outputs[name]):
            remarks[name] = change
    return failures, remarks


def _same_static_dims(declared: onnx.TypeProto.Tensor, candidate: onnx.TypeProto.Tensor) -> bool:
    if not declared.HasField("shape") or not candidate.HasField("shape"):
        return True
    if len(declared.shape.dim) != len(candidate.shape.dim):
        return False
    return all(
        not dim.HasField("dim_value") or (other.HasField("dim_value") and other.dim_value == dim.dim_value)
        for dim, other in zip(declared.shape.dim, candidate.shape.dim, strict=True)
    )


def _interface(values: Sequence[onnx.ValueInfoProto], model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return {value.name: value for value in values if value.name not in initializers}


def _type_text(value: onnx.ValueInfoProto) -> str:
    tensor = value.type.tensor_type
    dtype = _dtype_name(tensor.elem_type) if tensor.elem_type else "no dtype"
    if not tensor.HasField("shape"):
        return dtype
    dims = [str(dim.dim_value) if dim.HasField("dim_value") else dim.dim_param or "?" for dim in tensor.shape.dim]
    return f"{dtype}[{','.join(dims)}]"


_FIELD_TYPES = {
    contract.ATTR_NAMESPACE: onnx.AttributeProto.STRING,
    contract.ATTR_VERSION: onnx.AttributeProto.STRING,
    contract.ATTR_EPSILON: onnx.AttributeProto.FLOAT,
    contract.ATTR_WEIGHT_OFFSET: onnx.AttributeProto.FLOAT,
    contract.ATTR_WEIGHT_MODE: onnx.AttributeProto.INT,
    contract.ATTR_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_Q_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_K_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_OUTPUT_DTYPE: onnx.AttributeProto.INT,
}
_ARITY = {contract.RMS_NORM_OP: ((1, 2), 1), contract.QK_NORM_OP: ((2, 4), 2)}


def check_fused_nodes(fused: LoadedModel) -> None:
    """Every node in the trtfuse domain must be a contract op with its fields of the right types and values (a foreign
    or hand-edited file may hold anything); each problem is one line naming the node."""
    for node in fused.model.graph.node:
        if node.domain != contract.ONNX_DOMAIN:
            continue
        where = f"{fused.path}: node '{node.name or (node.output[0] if node.output else '')}'"
        if node.op_type not in contract.FUSED_OPS:
            raise TrtfuseError(f"{where}: {node.op_type} is no trtfuse op ({', '.join(contract.FUSED_OPS)})")
        (min_inputs, max_inputs), outputs = _ARITY[node.op_type]
        if not min_inputs <= len(node.input) <= max_inputs or len(node.output) != outputs:
            raise TrtfuseError(
                f"{where}: {node.op_type} takes {min_inputs}-{max_inputs} inputs and gives {outputs} output(s), "
                f"not {len(node.input)} and {len(node.output)}"
            )
        fields = contract.RMS_NORM_FIELDS if node.op_type == contract.RMS_NORM_OP else contract.QK_NORM_FIELDS
        attributes = {attribute.name: attribute for attribute in node.attribute}
        for name in (*fields, *contract.OPTIONAL_FIELDS):
            attribute = attributes.get(name)
            expected = _FIELD_TYPES.get(name)
            if attribute is None and name in contract.OPTIONAL_FIELDS:
                continue
            if attribute is None:
                raise TrtfuseError(f"{where}: {node.op_type} lacks attribute {name}")
            if expected is None:
                continue
            if attribute.type != expected:
                kind = onnx.AttributeProto.AttributeType.Name(expected).lower()
                raise TrtfuseError(f"{where}: attribute {name} must be one {kind}")
            _check_field_value(where, name, helper.get_attribute_value(attribute))


def _check_field_value(where: str, name: str, value: object) -> None:
    if name == contract.ATTR_EPSILON and not (math.isfinite(value) and value >= 0.0):
        raise TrtfuseError(f"{where}: epsilon {value} is not a finite non-negative number")
    if name == contract.ATTR_WEIGHT_OFFSET and not math.isfinite(value):
        raise TrtfuseError(f"{where}: weight_offset {value} is not finite")
    if name == contract.ATTR_WEIGHT_MODE and value not in {mode.value for mode in contract.WeightMode}:
        modes = ", ".join(f"{mode.value} ({mode.name})" for mode in contract.WeightMode)
        raise TrtfuseError(f"{where}: weight_mode {value} is none of {modes}")
    if name == contract.ATTR_OUTPUT_DTYPE and value not in contract.OUTPUT_DTYPE_CODES.values():
        codes = ", ".join(f"{code} ({dtype})" for dtype, code in contract.OUTPUT_DTYPE_CODES.items())
        raise TrtfuseError(f"{where}: output_dtype {value} is none of {codes}")
    if name in (contract.ATTR_HIDDEN, contract.ATTR_Q_HIDDEN, contract.ATTR_K_HIDDEN) and value < 1:
        raise TrtfuseError(f"{where}: {name} {value} is not a positive length")
