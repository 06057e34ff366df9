"""The one judgment `check` and `compare` pass on a candidate's outputs: blame the fusion only when it is to blame.

`judge_steps` runs the original (twice), the candidate and the float32 evaluation at every step, one model after
the other with one session alive at a time, and judges each output; `judge_lowered` does so with the lowered fused
model as the candidate.

Per output of the original:
- an output that differs between two runs of the original on the same inputs (uninitialised cache slots, say) says
  nothing about the candidate: it is left out, and the verdict says so;
- a window cache (the present of a GroupQueryAttention with sliding_window_cache=1) is compared on its resident
  rows only, [0, min(total length, window)): the rest of its buffer is unspecified, and a step's note says so;
- a missing output, a changed declared dtype, rank or static dim, a changed runtime shape or a NaN/inf mismatch
  fails (a renamed symbolic dim is only reported);
- integer, bool and string outputs must equal the original's;
- an output with no value to compare (a sequence, map or optional, a complex tensor) is not compared, and the
  verdict says so: the other outputs are judged as usual;
- float outputs of a float32 graph, and every float output when the user gives a tolerance, pass within the
  tolerance of the dtype that computed them (`tolerances.tolerance_for`);
- float outputs of a 16-bit or quantized graph are measured against a float32 evaluation of the original graph's
  arithmetic (`verify.widening`): they pass when the candidate's error there is at most `REFERENCE_MARGIN` times
  the original's own error, plus float32's tolerance, and both errors are reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from trtfuse.errors import TrtfuseError
from trtfuse.model.dims import model_dims, window_cache_outputs
from trtfuse.model.feeds import StepFeed
from trtfuse.model.interface import elem_type_name, value_types
from trtfuse.model.onnx_file import DEFAULT_DOMAINS, LoadedModel
from trtfuse.verify.interface import check_same_inputs, declared_output_differences
from trtfuse.verify.node_sites import NodeModels, node_models
from trtfuse.verify.node_verdict import NodeOutputVerdict, judge_nodes
from trtfuse.verify.onnxrt import (
    CpuSession,
    Notify,
    StepFunction,
    float32_session,
    loading_line,
    lowered_session,
    original_session,
    quiet,
    step_text,
    timed,
    widened_feed,
)
from trtfuse.verify.rotary_shapes import check_rotary_shapes, feed_shapes
from trtfuse.verify.tolerances import (
    REFERENCE_MARGIN,
    OutputError,
    ReferenceErrors,
    Tolerance,
    output_error,
    rms_error,
    tolerance_for,
)


@dataclass(frozen=True)
class OutputVerdict:
    """What was measured on one output and why it passed, failed or was left out (`passed` None)."""

    name: str
    dtype: str
    computed_in: str
    error: OutputError | None
    reference: ReferenceErrors | None
    passed: bool | None
    note: str = ""
    # False for an output with no value to compare (a sequence, a complex tensor): left out, whatever the runs gave.
    compared: bool = True

    @property
    def max_abs(self) -> float:
        return self.error.max_abs if self.error else math.inf

    @property
    def max_rel(self) -> float:
        return self.error.max_rel if self.error else math.inf

    def to_json(self) -> dict:
        """Plain values; non-finite errors stay floats for the JSON writer to spell."""
        error, reference = self.error, self.reference
        return {
            "name": self.name,
            "dtype": self.dtype,
            "computed_in": self.computed_in,
            "max_abs": error.max_abs if error else None,
            "max_rel": error.max_rel if error else None,
            "atol": error.tolerance.atol if error else None,
            "rtol": error.tolerance.rtol if error else None,
            "float32_evaluation": (
                {"original_error": reference.original, "candidate_error": reference.candidate, "bound": reference.bound}
                if reference
                else None
            ),
            "passed": self.passed,
            "note": self.note,
        }


def same_runs(first: np.ndarray, second: np.ndarray) -> bool:
    """Bit-for-bit agreement of two runs of one model (NaN equal to NaN)."""
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    if first.dtype.kind in "fc" or first.dtype.name == "bfloat16":
        return bool(np.array_equal(first.astype(np.float64), second.astype(np.float64), equal_nan=True))
    return bool(np.array_equal(first, second))


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


STRING = "string"
# What onnxruntime returns for each kind of non-tensor output, as the ONNX type names it.
_VALUE_KINDS = {list: "sequence", dict: "map", type(None): "optional"}


def is_strings(value: object) -> bool:
    """A tensor of strings: onnxruntime's object arrays, the reference evaluator's fixed-width ones."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "OUS"


def is_numbers(value: object) -> bool:
    """A tensor of real numbers or bools, which tolerances judge."""
    return isinstance(value, np.ndarray) and (value.dtype.kind in "biuf" or value.dtype.name == "bfloat16")


def uncompared_kind(value: object) -> str:
    """'' for a tensor of real numbers, bools or strings; else what the value is (`sequence`, `complex64`)."""
    if is_numbers(value) or is_strings(value):
        return ""
    if isinstance(value, np.ndarray):
        return value.dtype.name
    return _VALUE_KINDS.get(type(value), type(value).__name__)


def uncompared_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """Per graph output declared as something with no value to compare, what it is declared as: a sequence, map,
    optional or sparse tensor, or a complex tensor."""
    kinds = {}
    for output in model.graph.output:
        kind = output.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            kinds[output.name] = kind.removesuffix("_type")
        elif output.type.tensor_type.elem_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            kinds[output.name] = elem_type_name(output.type.tensor_type.elem_type)
    return kinds


def _kind_text(kind: str) -> str:
    """An `uncompared_kind` in words: `a sequence`, `complex64 values`."""
    return f"{kind} values" if kind.startswith("complex") else f"a {kind.replace('_', ' ')}"


def _value_text(value: object) -> str:
    if is_numbers(value):
        return "numbers"
    return "strings" if is_strings(value) else _kind_text(uncompared_kind(value))


def _short(text: object, limit: int = 40) -> str:
    spelled = repr(text)
    return spelled if len(spelled) <= limit else f"{spelled[: limit - 3]}..."


@dataclass(frozen=True)
class Judge:
    """How to judge: `tolerance` set by the user replaces every default; `computed_in` maps an output to the dtype
    of the computation that produced it (an fp16 model's `logits.float()` is float16's); `declared` holds, per output,
    why the candidate's declared interface differs from the original's so that it fails; `remarks`, differences
    that are only reported; `uncompared`, the outputs declared as values with nothing to compare and what they are
    (`uncompared_outputs`)."""

    tolerance: Tolerance | None = None
    computed_in: Mapping[str, str] | None = None
    declared: Mapping[str, str] | None = None
    remarks: Mapping[str, str] | None = None
    uncompared: Mapping[str, str] | None = None

    def outputs(
        self,
        original: Mapping[str, np.ndarray],
        original_again: Mapping[str, np.ndarray],
        candidate: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray] | None,
    ) -> list[OutputVerdict]:
        return [
            self.output(name, expected, original_again[name], candidate.get(name), reference)
            for name, expected in original.items()
        ]

    def output(
        self,
        name: str,
        expected: np.ndarray,
        expected_again: np.ndarray,
        actual: np.ndarray | None,
        reference: Mapping[str, np.ndarray] | None,
    ) -> OutputVerdict:
        kind = (self.uncompared or {}).get(name) or uncompared_kind(expected)
        if kind:
            note = f"not compared: {_kind_text(kind)} (only tensors of real numbers, bools and strings are compared)"
            return OutputVerdict(name, kind, kind, error=None, reference=None, passed=None, note=note, compared=False)
        if is_strings(expected):
            return self._strings(name, expected, expected_again, actual)
        dtype = np.dtype(expected.dtype).name
        computed_in = (self.computed_in or {}).get(name, dtype)
        verdict = {"name": name, "dtype": dtype, "computed_in": computed_in}
        if actual is None:
            return OutputVerdict(**verdict, error=None, reference=None, passed=False, note="missing from the candidate")
        if not is_numbers(actual):
            note = f"{_value_text(actual)} in the candidate, numbers in the original"
            return OutputVerdict(**verdict, error=None, reference=None, passed=False, note=note)
        tolerance = self.tolerance if self.tolerance and is_float(expected.dtype) else tolerance_for(computed_in)
        error = output_error(name, np.asarray(actual), expected, tolerance)
        if not same_runs(expected, expected_again):
            spread = output_error(name, expected_again, expected)
            note = f"left out: two runs of the original differ (max abs {spread.max_abs:.3e})"
            return OutputVerdict(**verdict, error=error, reference=None, passed=None, note=note)
        declared = (self.declared or {}).get(name)
        if declared:
            return OutputVerdict(**verdict, error=error, reference=None, passed=False, note=declared)
        if actual.shape != expected.shape:
            note = f"shape {_shape(actual)}, the original's {_shape(expected)}"
            return OutputVerdict(**verdict, error=error, reference=None, passed=False, note=note)
        remark = (self.remarks or {}).get(name, "")
        if reference is None or self.tolerance is not None or not is_float(expected.dtype) or name not in reference:
            return OutputVerdict(**verdict, error=error, reference=None, passed=error.passed, note=remark)
        errors = ReferenceErrors(rms_error(expected, reference[name]), rms_error(np.asarray(actual), reference[name]))
        # Identical outputs cannot be blamed, whatever the reference says.
        passed = errors.passed or error.max_abs == 0.0
        return OutputVerdict(**verdict, error=error, reference=errors, passed=passed, note=remark)

    def _strings(
        self, name: str, expected: np.ndarray, expected_again: np.ndarray, actual: np.ndarray | None
    ) -> OutputVerdict:
        """A string output: equal to the original's, element by element, or failed naming the first difference."""

        def verdict(passed: bool | None, note: str) -> OutputVerdict:
            return OutputVerdict(name, STRING, STRING, error=None, reference=None, passed=passed, note=note)

        if actual is None:
            return verdict(False, "missing from the candidate")
        if not same_runs(expected, expected_again):
            return verdict(None, "left out: two runs of the original differ")
        declared = (self.declared or {}).get(name)
        if declared:
            return verdict(False, declared)
        if not is_strings(actual):
            return verdict(False, f"{_value_text(actual)} in the candidate, strings in the original")
        if actual.shape != expected.shape:
            return verdict(False, f"shape {_shape(actual)}, the original's {_shape(expected)}")
        differ = np.not_equal(actual.astype(object), expected.astype(object))
        if not differ.any():
            remark = (self.remarks or {}).get(name)
            return verdict(True, f"compared for equality; {remark}" if remark else "compared for equality")
        first = tuple(int(index) for index in np.argwhere(differ)[0])
        where = ", ".join(map(str, first))
        return verdict(
            False,
            f"{int(differ.sum())} of {differ.size} strings differ, the first at [{where}]: {_short(actual[first])}, "
            f"the original's {_short(expected[first])}",
        )


def _shape(array: np.ndarray) -> str:
    return "x".join(str(dim) for dim in array.shape) or "scalar"


_FLOAT_OUTPUTS = {"float16", "bfloat16", "float32", "float64"}
# How progress lines name the models a check runs.
LOWERED_NAME = "the fused model (plugin nodes lowered)"
FLOAT32_NAME = "the float32 evaluation of the original"


@dataclass(frozen=True)
class StepResult:
    """The verdict on every output of the original at one step (an output left out has `passed` None), and on each
    output of each fused node where it stands (`nodes`, in graph order; `verify.node_verdict`)."""

    name: str
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[OutputVerdict]
    notes: tuple[str, ...] = ()
    # Seconds each run of the step took: the original (first run), the candidate, the float32 evaluation.
    seconds: dict[str, float] = field(default_factory=dict)
    nodes: list[NodeOutputVerdict] = field(default_factory=list)

    @property
    def judged(self) -> list[OutputVerdict]:
        return [output for output in self.outputs if output.passed is not None]

    @property
    def passed(self) -> bool:
        return bool(self.judged) and all(output.passed for output in self.judged) and self.nodes_passed

    @property
    def nodes_passed(self) -> bool:
        return all(node.passed for node in self.nodes)


@dataclass(frozen=True)
class CheckResult:
    """Every step's verdicts; `seed` is None when the inputs came from a file. `unjudged_nodes` names each fused node
    judged end to end only, with the reason (`node_sites.NodeSite.notes`)."""

    steps: list[StepResult]
    seed: int | None
    inputs_file: Path | None = None
    judged_by: str = "tolerance"
    unjudged_nodes: tuple[tuple[str, str], ...] = ()

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(step.passed for step in self.steps)

    @property
    def errors(self) -> list[OutputVerdict]:
        return [output for step in self.steps for output in step.outputs]

    @property
    def first_node_failure(self) -> tuple[str, NodeOutputVerdict] | None:
        """The first fused node output that fails, in step order then graph order, with its step's name."""
        return next(((step.name, node) for step in self.steps for node in step.nodes if not node.passed), None)

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "inputs_file": str(self.inputs_file) if self.inputs_file else None,
            "judged_by": self.judged_by,
            "margin": REFERENCE_MARGIN,
            "unjudged_nodes": [{"node": node, "reason": reason} for node, reason in self.unjudged_nodes],
            "steps": [
                {
                    "step": step.name,
                    "input_shapes": {name: list(shape) for name, shape in step.input_shapes.items()},
                    "notes": list(step.notes),
                    "seconds": step.seconds,
                    "passed": step.passed,
                    "outputs": [output.to_json() for output in step.outputs],
                    "nodes": [node.to_json() for node in step.nodes],
                }
                for step in self.steps
            ],
        }


def judge_lowered(
    original: LoadedModel,
    fused: LoadedModel,
    feeds: Sequence[StepFeed],
    seed: int | None,
    inputs_file: Path | None = None,
    tolerance: Tolerance | None = None,
    notify: Notify = quiet,
) -> CheckResult:
    """Judge `fused`, its plugin nodes lowered to standard ops, against `original` at each of `feeds`: what `check`
    runs, and `compare` without an engine. The fused model's plugin nodes are read, and its rotary nodes held to
    their shape rule at the feeds' shapes, before any session loads, so a broken one is one line and nothing else."""
    check_same_inputs(original, fused)
    check_rotary_shapes(fused, [feed_shapes(step.feed) for step in feeds])
    judge = judge_for(original, tolerance, *declared_output_differences(original, fused))
    nodes = node_models(original, fused)
    runner, note = original_session(original, notify, exposed=nodes.exposed)
    lowered = lowered_session(fused, evaluator=runner.evaluator)
    return judge_steps(runner, lowered, feeds, judge, seed, inputs_file, note, notify, LOWERED_NAME, nodes)


def judge_for(
    original: LoadedModel,
    tolerance: Tolerance | None,
    declared: Mapping[str, str] | None = None,
    remarks: Mapping[str, str] | None = None,
) -> Judge:
    return Judge(
        tolerance, computed_dtypes(original.model), declared or {}, remarks or {}, uncompared_outputs(original.model)
    )


def judge_steps(
    runner: CpuSession,
    candidate: CpuSession | AbstractContextManager[StepFunction],
    feeds: Sequence[StepFeed],
    judge: Judge,
    seed: int | None,
    inputs_file: Path | None = None,
    note: str = "",
    notify: Notify = quiet,
    candidate_name: str = "the candidate",
    nodes: NodeModels | None = None,
) -> CheckResult:
    """Run the original (`runner`) twice, the candidate once and, where the verdict uses it, the float32 evaluation
    of the original, at every step; judge each output. `note` goes with every step. With `nodes` (the fused model's
    nodes where they stand, `node_sites.node_models`; `runner` exposing the tensors they name), judge each fused
    node too (`node_verdict.judge_nodes`), after the float32 evaluation.

    Each model runs all the steps before the next one loads, and each is released after its last step: one session
    is alive at a time. A candidate that is no `CpuSession` (an engine) is a context manager loading it on entry,
    entered after the original's last run and left before the float32 evaluation loads, giving the step function.
    `notify` hears which model loads and which step runs."""
    original = runner.model
    seconds: list[dict[str, float]] = [{} for _ in feeds]
    firsts, agains, exposed = [], [], []
    with runner:
        for index, step in enumerate(feeds):
            notify(f"the original: {step_text(index, feeds)}, twice")
            first, tensors = timed(seconds[index], "original", runner.run_exposing, step.feed)
            firsts.append(first)
            exposed.append(tensors)
            agains.append(runner.run(step.feed))
    if isinstance(candidate, CpuSession):
        notify(loading_line(candidate_name, candidate))
        with candidate:
            candidates = _steps_run(candidate_name, candidate.run, feeds, seconds, notify)
    else:
        with candidate as run:
            candidates = _steps_run(candidate_name, run, feeds, seconds, notify)
    notes = [[note] if note else [] for _ in feeds]
    reference = float32_session(original) if judge.tolerance is None else None
    expected_outputs = _reference_outputs(reference, feeds, seconds, notes, notify)
    node_verdicts = [[] for _ in feeds]
    if nodes is not None:
        node_verdicts = judge_nodes(nodes, feeds, exposed, runner.evaluator, judge.tolerance, seconds, notes, notify)
    windows = window_cache_outputs(original.model)
    reading = model_dims(original.model) if windows else None
    steps = []
    for index, step in enumerate(feeds):
        first, again, actual, expected = firsts[index], agains[index], candidates[index], expected_outputs[index]
        total = reading.total_length(step.dims) if reading is not None else None
        if windows and total is not None:
            # Rows past the resident ones are whatever the buffer held: comparing them would leave every window
            # cache out as "two runs of the original differ", judging nothing.
            first, again, actual, expected = (
                _resident_rows(outputs, windows, total) for outputs in (first, again, actual, expected)
            )
            rows = ", ".join(f"{name} [0, {min(total, window)})" for name, window in sorted(windows.items()))
            notes[index].append(f"window caches: only the resident rows are compared ({rows}); the rest is unspecified")
        steps.append(
            StepResult(
                name=step.step,
                input_shapes={name: tuple(array.shape) for name, array in step.feed.items()},
                outputs=judge.outputs(first, again, actual, expected),
                notes=tuple(notes[index]),
                seconds=seconds[index],
                nodes=node_verdicts[index],
            )
        )
    judged_by = "float32 evaluation" if reference is not None else "tolerance"
    unjudged = () if nodes is None else tuple((site.name, note) for site in nodes.sites for note in site.notes)
    return CheckResult(steps, seed, inputs_file, judged_by, unjudged)


def _steps_run(
    name: str, run: StepFunction, feeds: Sequence[StepFeed], seconds: Sequence[dict[str, float]], notify: Notify
) -> list[Mapping[str, np.ndarray]]:
    """The candidate's outputs at every step."""
    outputs = []
    for index, step in enumerate(feeds):
        notify(f"{name}: {step_text(index, feeds)}")
        outputs.append(timed(seconds[index], "candidate", run, step.feed))
    return outputs


def _reference_outputs(
    reference: CpuSession | None,
    feeds: Sequence[StepFeed],
    seconds: Sequence[dict[str, float]],
    notes: Sequence[list[str]],
    notify: Notify,
) -> list[Mapping[str, np.ndarray] | None]:
    """The float32 evaluation's outputs at every step (None where there is none: a step it cannot run says why in
    its notes, and is judged by tolerance); the session is released after the last step."""
    outputs: list[Mapping[str, np.ndarray] | None] = [None] * len(feeds)
    if reference is None:
        return outputs
    notify(loading_line(FLOAT32_NAME, reference))
    try:
        for index, step in enumerate(feeds):
            notify(f"{FLOAT32_NAME}: {step_text(index, feeds)}")
            try:
                outputs[index] = timed(seconds[index], "float32 evaluation", reference.run, widened_feed(step.feed))
            except TrtfuseError as error:
                notes[index].append(f"no float32 evaluation of the original ({error}): judged by tolerance")
    finally:
        reference.release()
    return outputs


def _resident_rows(
    outputs: Mapping[str, np.ndarray] | None, windows: Mapping[str, int], total: int
) -> Mapping[str, np.ndarray] | None:
    """`outputs` with each window cache (BNSH, capacity C = its window) cut to the rows a step of `total` tokens in
    all leaves resident: [0, min(total, C))."""
    if outputs is None:
        return None
    cut = dict(outputs)
    for name, window in windows.items():
        array = cut.get(name)
        if isinstance(array, np.ndarray) and array.ndim == 4 and array.shape[2] == window:
            cut[name] = array[:, :, : min(total, window)]
    return cut


def computed_dtypes(model: onnx.ModelProto, names: Iterable[str] | None = None) -> dict[str, str]:
    """Per graph output (or per tensor of `names`), the dtype of the computation that produced it: the loosest float
    dtype along the Casts and Identities it comes out of (an fp16 model's `logits.float()` is float16's)."""
    graph, types = value_types(model)
    producers = {output: node for node in graph.node for output in node.output}
    computed = {}
    for name in [output.name for output in graph.output] if names is None else names:
        chain = [name]
        node = producers.get(name)
        while node is not None and node.op_type in ("Cast", "Identity") and node.domain in DEFAULT_DOMAINS:
            chain.append(node.input[0])
            node = producers.get(node.input[0])
        dtypes = [elem_type_name(types[link]) for link in chain if types.get(link)]
        floats = [dtype for dtype in dtypes if dtype in _FLOAT_OUTPUTS]
        if floats:
            computed[name] = max(floats, key=lambda dtype: tolerance_for(dtype).rtol)
        elif dtypes:
            computed[name] = dtypes[-1]
    return computed
