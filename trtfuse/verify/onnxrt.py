"""Models run on the CPU, the one way `check` and `compare` run them: onnxruntime without graph optimisations, every
16-bit value rounded where the graph says, and onnx's reference evaluator for bfloat16 graphs or where onnxruntime
cannot load the original; the fused model with its plugin nodes lowered; the float32 evaluation of the original.

Memory: a session reads the large weights from the external data files themselves (onnxruntime maps them; the proto
it is given holds only the small tensors `model.onnx_file.load_model` read), and a caller that runs several models
holds one session at a time (`CpuSession` as a context manager: loaded on entry, released on exit). A 16-bit model
runs each weight's float32 copy (onnxruntime's CPU kernels compute most 16-bit ops in float32) just before the op
that reads it, not all of them at once (`onnxruntime_session`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import onnx
from onnx import external_data_helper, helper

from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError, first_line
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.model.feeds import StepFeed
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.verify.widening import NARROW_FLOATS, is_reduced_precision, widen_to_float32

# onnxruntime resolves external data of a model given as bytes against this folder.
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"

# onnxruntime's messages about a feed the graph cannot take; the sizes are what the user can change. A Gather out of
# bounds is a position table (GPT-2's wpe) shorter than the tokens fed.
_SHAPE_ERROR = re.compile(r"shape|dimension|rank|broadcast|reshape|size|out of data bounds", re.IGNORECASE)

StepFunction = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
R = TypeVar("R")
# One run of a loaded model on a feed, giving the values of the tensors named.
_Fetch = Callable[[Mapping[str, np.ndarray], Sequence[str]], dict[str, np.ndarray]]
# Hears what a long call is doing (`trtfuse check`'s progress lines, which the CLI prints on stderr).
Notify = Callable[[str], None]


def quiet(_line: str) -> None:
    return None


_SIZE_HINT = ("; set the input sizes with ", Choice("dim"), " SYMBOL=N or ", Choice("shape"), " NAME=D0xD1")


def onnxruntime_session(model: LoadedModel) -> object:
    """An onnxruntime CPU session running `model` as written: no graph optimisations, which would fuse and re-round
    the very norm chains being checked. External data resolves as `model.onnx_file.load_model` resolves it: against
    the folder the model's path names, not the target of a symlinked model file."""
    try:
        import onnxruntime
    except ImportError:
        raise MissingDependencyError("onnxruntime is not installed: pip install onnxruntime") from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    # The default order runs every node as soon as its inputs are ready: the Casts onnxruntime inserts before the
    # float32 kernels of a 16-bit graph's MatMuls read initializers only, so all of them ran first and every weight's
    # float32 copy was alive at once (3.6x the weights' bytes on a 0.16 B fp16 Llama). The priority-based order runs
    # each just before its MatMul (1.8x). No value changes: each node computes the same outputs from the same inputs.
    options.execution_order = onnxruntime.ExecutionOrder.PRIORITY_BASED
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


class CpuSession:
    """One model on the CPU, loaded once and run on any number of feeds: onnxruntime, or onnx's reference evaluator
    (exact per-op rounding, slow) for bfloat16 models, which onnxruntime's CPU kernels mostly lack, and where asked.
    `exposed` names tensors of the graph that `run_exposing` gives besides the outputs (`check` reads the values
    each fused node reads and replaces there).

    As a context manager it is loaded on entry and released on exit (`release`): a session holds the weights it
    read and its buffers, so a caller running several models in turn keeps one alive at a time."""

    def __init__(self, model: LoadedModel, evaluator: bool = False, exposed: Sequence[str] = ()) -> None:
        self.model = model
        self.evaluator = evaluator or uses_bfloat16(model.model)
        self.exposed = tuple(exposed)
        self.outputs = [output.name for output in model.model.graph.output]
        self._run: _Fetch | None = None

    @property
    def loaded(self) -> bool:
        return self._run is not None

    def load(self) -> CpuSession:
        if self._run is None:
            self._run = self._evaluator() if self.evaluator else self._onnxruntime()
        return self

    def release(self) -> None:
        """Drop the loaded session and what it holds; a later `run` loads it again."""
        self._run = None

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.load()._run(feed, self.outputs)

    def run_exposing(self, feed: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The outputs, and the values of the `exposed` tensors, of one run."""
        # An exposed tensor may be an output too: each name is fetched once.
        values = self.load()._run(feed, list(dict.fromkeys([*self.outputs, *self.exposed])))
        outputs = {name: values[name] for name in self.outputs}
        return outputs, {name: values[name] for name in self.exposed}

    def __enter__(self) -> CpuSession:
        return self.load()

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def _onnxruntime(self) -> _Fetch:
        # The model's own outputs and the exposed tensors, not the outputs `keep_16_bit_roundings` adds.
        runs_it = _as_onnxruntime_runs_it(self.model.model, self.exposed)
        session = onnxruntime_session(LoadedModel(model=runs_it, path=self.model.path))

        def run(feed: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
            try:
                outputs = session.run(list(names), dict(feed))
            except Exception as error:
                # onnxruntime raises its own exception types for unsupported ops, bad graphs and bad feeds alike.
                message = first_line(error)
                raise _runtime_error(f"{self.model.path}: onnxruntime cannot run it: {message}", message) from None
            # onnxruntime's arrays are views of its own buffers, each keeping the session's memory arena alive: the
            # outputs outlive the session (a check holds every step's), so they are copied out of it.
            return {
                name: np.array(value) if isinstance(value, np.ndarray) else value
                for name, value in zip(names, outputs, strict=True)
            }

        return run

    def _evaluator(self) -> _Fetch:
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

        def run(feed: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
            try:
                # The evaluator keeps every value of a run: it gives any tensor asked for.
                return dict(zip(names, evaluator.run(list(names), dict(feed)), strict=True))
            except Exception as error:
                message = f"onnx's reference evaluator cannot run it: {first_line(error)}"
                raise _runtime_error(f"{self.model.path}: {message}", message) from None

        return run


def _as_onnxruntime_runs_it(model: onnx.ModelProto, exposed: Sequence[str] = ()) -> onnx.ModelProto:
    """The model without its recorded intermediate shapes, which onnxruntime infers itself (an exporter's stale ones,
    such as genai's `sequence_length` where a decode step has the total length, make it re-use a buffer of the wrong
    size), with its 16-bit roundings kept and the `exposed` tensors as outputs too (their types inferred)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    kept = keep_16_bit_roundings(bare)
    outputs = {output.name for output in kept.graph.output}
    kept.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(exposed) if name not in outputs)
    return kept


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


def _runtime_error(text: str, message: str) -> TrtfuseError:
    """`text` as an error; where the runtime's `message` is about the sizes fed (not types), with what to change."""
    if _SHAPE_ERROR.search(message) and "type" not in message.lower():
        return OptionError("shape", text, *_SIZE_HINT)
    return TrtfuseError(text)


def step_text(index: int, feeds: Sequence[StepFeed]) -> str:
    """How progress lines name step `index` of `feeds`."""
    return f"step {index + 1} of {len(feeds)} ({feeds[index].step})"


def timed(
    seconds: dict[str, float], what: str, run: Callable[[Mapping[str, np.ndarray]], R], feed: Mapping[str, np.ndarray]
) -> R:
    """`run(feed)`, its seconds recorded in `seconds[what]`."""
    started = time.perf_counter()
    outputs = run(feed)
    seconds[what] = time.perf_counter() - started
    return outputs


def loading_line(what: str, session: CpuSession) -> str:
    """The progress line of `session` loading: `what` it is, in which runtime, from which file."""
    runtime = "onnx's reference evaluator" if session.evaluator else "onnxruntime"
    return f"loading {what} in {runtime}: {session.model.path}"


def original_session(
    original: LoadedModel, notify: Notify = quiet, exposed: Sequence[str] = ()
) -> tuple[CpuSession, str]:
    """The original's runner (giving the `exposed` tensors too, `CpuSession.run_exposing`), loaded, and a note when
    it is not onnxruntime: where onnxruntime cannot load a model (dynamo's opset-23 fp16 Gemma3 mixes fp16 and fp32
    in one Mul), onnx's reference evaluator runs it, and the fused model with it. `notify` hears of each load."""
    runner = CpuSession(original, exposed=exposed)
    notify(loading_line("the original", runner))
    try:
        return runner.load(), ""
    except TrtfuseError as error:
        if runner.evaluator:
            raise
        note = f"{error}; both models run in onnx's reference evaluator instead"
        runner = CpuSession(original, evaluator=True, exposed=exposed)
        notify(loading_line("the original", runner))
        return runner.load(), note


def lowered_session(fused: LoadedModel, evaluator: bool) -> CpuSession:
    """`fused` with its plugin nodes lowered to standard ops (`trtfuse.fusion.lowering`), run as the original is run."""
    lowered_model = lower_fused_nodes(fused.model, fused.path)
    for output in lowered_model.graph.output:
        if output.type.HasField("tensor_type") and not output.type.tensor_type.elem_type:
            # onnxruntime refuses an undefined output dtype but infers a missing type: the output still runs, and
            # `verify.interface.declared_output_differences` fails it.
            output.ClearField("type")
    return CpuSession(LoadedModel(model=lowered_model, path=fused.path), evaluator=evaluator)


def float32_session(original: LoadedModel) -> CpuSession | None:
    """The float32 evaluation of a 16-bit or quantized original (`trtfuse.verify.widening`); None for a float32 one."""
    if not is_reduced_precision(original.model):
        return None
    return CpuSession(LoadedModel(model=widen_to_float32(original.model), path=original.path))


def widened_feed(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feed` as the float32 evaluation takes it: every 16-bit float input widened to float32."""
    narrow = {np.dtype(helper.tensor_dtype_to_np_dtype(elem)) for elem in NARROW_FLOATS}
    return {name: array.astype(np.float32) if array.dtype in narrow else array for name, array in feed.items()}
