"""The verdict on each fused node where it stands: `check` runs every node on the original's own values of what it
reads and compares its outputs with the original's tensors they take the place of (`verify.node_sites`; docs/cli.md,
"Each fused node").

Per output of a node:
- a quantized output (FP8 or INT8 codes): the codes must be, bit for bit, the original's own QuantizeLinear applied
  to the value the node quantized (y rounded to T). That is the contract's output stage, and it leaves no room: a
  scale, dtype or saturation other than the graph's changes codes. Where the node's codes differ from the original's
  codes, the two quantized different values (each on its side of a rounding boundary); that value is judged next;
- the value (a 16-bit or float32 output, or the y a quantized output quantized) passes when its RMS error against the
  reference, the original's own ops from the same inputs in float32 with the quantizers kept where the graph rounds
  (`widening.widen_to_float32(keep_quantizers=True)`), is at most `NODE_MARGIN` times the original's own error
  plus float32's rtol (`tolerances.ReferenceErrors`), or when it equals the original's. In a float32 original the
  original's values are the reference (its error 0). Where the reference cannot run, the value is judged within the
  tolerance of its dtype against the original's, and the step says why; where the user gives a tolerance (--rtol,
  --atol), within that, as every float output is. Codes have no tolerance;
- a rotation stage (the normalised y's pair, a product's): its codes as a quantized output's, each besides at most
  `PRODUCT_STEPS` step of its grid from the original's codes (a product's anywhere in a head row where the
  normalised stage's codes did not move; none in a part whose inverse root is quantized, whose rows move with their
  r'), its value as any value; the rotated output its products sum into, element
  by element within the two products' DequantizeLinear differences plus one ulp of its dtype (`_sum_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from trtfuse.errors import TrtfuseError
from trtfuse.model.feeds import StepFeed
from trtfuse.verify.node_sites import JudgedOutput, NodeModels, NodeSite
from trtfuse.verify.onnxrt import CpuSession, Notify, loading_line, step_text, timed, widened_feed
from trtfuse.verify.tolerances import (
    NODE_MARGIN,
    REFERENCE_FLOOR,
    OutputError,
    ReferenceErrors,
    Tolerance,
    output_error,
    rms_error,
    tolerance_for,
)

# How progress lines name the two models.
NODES_NAME = "each fused node on the original's tensors"
REFERENCE_NAME = "the float32 evaluation of the original's ops at each fused node"
# How many steps of its quantizer's grid a rotation stage's code may move from the original's: where the node's y
# and the graph's differ in their last bit, a value near a rounding boundary lands on the other side, one step.
PRODUCT_STEPS = 1


def _index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, index)) + "]"


@dataclass(frozen=True)
class StepCheck:
    """A rotation stage's codes against the original's own codes: at most `PRODUCT_STEPS` steps of the quantizer's
    grid apart (where a stage before it moved, a normalised code or a row's r', as far again as that move allows:
    `allowed` there); `steps` the most, or the failing code's, at `index` (the original's layout) with the node's
    code and the original's."""

    steps: int
    index: tuple[int, ...] | None = None
    code: float | None = None
    original: float | None = None
    allowed: int = PRODUCT_STEPS

    @property
    def passed(self) -> bool:
        return self.steps <= self.allowed

    def text(self) -> str:
        if self.passed:
            where = "" if self.allowed == PRODUCT_STEPS else " (where a stage before it moved)"
            return f"at most {max(self.steps, PRODUCT_STEPS)} step{'s' * (self.steps > 1)} from the original's{where}"
        allowed = (
            f"{PRODUCT_STEPS} step"
            if self.allowed == PRODUCT_STEPS
            else f"{self.allowed} steps there, where a stage before it moved"
        )
        return (
            f"a code {self.steps} steps from the original's at {_index(self.index or ())}: {self.code:g}, the "
            f"original's {self.original:g} (a product may move {allowed})"
        )


@dataclass(frozen=True)
class CodeCheck:
    """A quantized output's codes against the original's QuantizeLinear (`quantizer`) applied to the value the node
    quantized: `wrong` of `elements` differ (none may), the first at `first` with the node's code, the quantizer's
    and the value; `moved`, how many differ from the original's own codes (the values judged say why); for a
    rotation's product stage, how far they moved (`steps`)."""

    dtype: str
    quantizer: str
    elements: int
    wrong: int
    moved: int
    first: tuple[int, ...] | None = None
    code: float | None = None
    expected: float | None = None
    value: float | None = None
    steps: StepCheck | None = None

    @property
    def passed(self) -> bool:
        return self.wrong == 0 and (self.steps is None or self.steps.passed)

    def text(self) -> str:
        if self.wrong == 0:
            steps = "" if self.steps is None else f", {self.steps.text()}"
            return (
                f"{self.dtype} codes: the original {self.quantizer}'s of the node's values, bit for bit "
                f"({self.moved} of {self.elements} differ from the original's codes{steps})"
            )
        where = f", the first at {_index(self.first)}" if self.first is not None else ""
        numbers = (
            f": {self.code:g}, where the original's quantizer gives {self.expected:g} (value {self.value:.6g})"
            if self.first is not None
            else ""
        )
        return (
            f"{self.wrong} of {self.elements} {self.dtype} codes are not the original {self.quantizer}'s of the "
            f"node's own values{where}{numbers}"
        )

    def to_json(self) -> dict:
        return {
            "dtype": self.dtype,
            "quantizer": self.quantizer,
            "elements": self.elements,
            "not_the_quantizers": self.wrong,
            "differ_from_original": self.moved,
            "first": None
            if self.first is None
            else {"index": list(self.first), "code": self.code, "quantizer_gives": self.expected, "value": self.value},
            "steps_from_original": None if self.steps is None else self.steps.steps,
            "steps_allowed": None if self.steps is None else self.steps.allowed,
        }


@dataclass(frozen=True)
class SumBound:
    """A rotated output whose products are quantized, against the original's element by element: `beyond` of
    `elements` differ by more than `allowed` there (none may: the two products' differences plus one unit in the
    last place of the sum's dtype `dtype`), the first at `first`, with the node's value and the original's."""

    dtype: str
    elements: int
    differ: int
    beyond: int
    first: tuple[int, ...] | None = None
    candidate: float | None = None
    original: float | None = None
    allowed: float | None = None

    @property
    def passed(self) -> bool:
        return self.beyond == 0

    def text(self) -> str:
        rule = f"its products' differences plus one {self.dtype} ulp"
        if self.passed:
            return f"within {rule} of the original's ({self.differ} of {self.elements} differ)"
        return (
            f"{self.beyond} of {self.elements} further from the original's than {rule}, the first at "
            f"{_index(self.first or ())}: {self.candidate:.6g}, the original's {self.original:.6g}, allowed "
            f"{self.allowed:.3e}"
        )

    def to_json(self) -> dict:
        return {
            "elements": self.elements,
            "differ": self.differ,
            "beyond": self.beyond,
            "first": None
            if self.first is None
            else {
                "index": list(self.first),
                "candidate": self.candidate,
                "original": self.original,
                "allowed": self.allowed,
            },
        }


@dataclass(frozen=True)
class Worst:
    """The element where the node's value is furthest from the original's, with the reference's there."""

    index: tuple[int, ...]
    candidate: float
    original: float
    reference: float


@dataclass(frozen=True)
class NodeOutputVerdict:
    """One output of a fused node at one step: its codes (a quantized output) and its value (`values_passed`),
    judged against the float32 evaluation (`errors`) or, where that could not run, within the tolerance of its dtype
    (`error`); `note` says why a value could not be compared."""

    node: str
    op: str
    tensor: str
    value: str
    values_passed: bool
    errors: ReferenceErrors | None = None
    error: OutputError | None = None
    worst: Worst | None = None
    codes: CodeCheck | None = None
    note: str = ""
    bound: SumBound | None = None

    @property
    def passed(self) -> bool:
        return self.values_passed and (self.codes is None or self.codes.passed)

    def text(self) -> str:
        """What was judged, the failing part first, in one line."""
        parts = [self._values_text()] if self.codes is None else [self.codes.text(), self._values_text()]
        if not self.values_passed:
            parts.reverse()
        return "; ".join(parts)

    def _values_text(self) -> str:
        what = f"values ('{self.value}')" if self.value != self.tensor else "values"
        if self.note:
            return f"{what}: {self.note}"
        if self.bound is not None:
            return f"{what} {self.bound.text()}"
        error, errors, worst = self.error, self.errors, self.worst
        if errors is None:
            if error is None:
                return f"{what}: not compared"
            relation = "within" if error.passed else "beyond"
            tolerance = error.tolerance
            return (
                f"{what} {relation} rtol {tolerance.rtol:g} or atol {tolerance.atol:g} of the original's (max abs "
                f"{error.max_abs:.3e}, max rel {error.max_rel:.3e})"
            )
        if worst is None:
            return f"{what} equal to the original's"
        relation = "<=" if errors.passed else ">"
        text = (
            f"{what}: error against the float32 evaluation {errors.candidate:.3e} {relation} {errors.margin:g} x "
            f"the original's {errors.original:.3e} + {REFERENCE_FLOOR:g} = {errors.bound:.3e}"
        )
        if errors.passed:
            return text
        return (
            f"{text}; the largest difference at {_index(worst.index)}: {worst.candidate:.6g}, the original's "
            f"{worst.original:.6g}, the evaluation's {worst.reference:.6g}"
        )

    def to_json(self) -> dict:
        errors, error, worst = self.errors, self.error, self.worst
        return {
            "node": self.node,
            "op": self.op,
            "output": self.tensor,
            "value": self.value,
            "passed": self.passed,
            "codes": None if self.codes is None else self.codes.to_json(),
            "values_passed": self.values_passed,
            "float32_evaluation": None
            if errors is None
            else {"original_error": errors.original, "candidate_error": errors.candidate, "bound": errors.bound},
            "max_abs": None if error is None else error.max_abs,
            "max_rel": None if error is None else error.max_rel,
            "worst": None
            if worst is None
            else {
                "index": list(worst.index),
                "candidate": worst.candidate,
                "original": worst.original,
                "reference": worst.reference,
            },
            "note": self.note,
            "sum_bound": None if self.bound is None else self.bound.to_json(),
            "text": self.text(),
        }


def judge_nodes(
    models: NodeModels,
    feeds: Sequence[StepFeed],
    exposed: Sequence[Mapping[str, np.ndarray]],
    evaluator: bool,
    tolerance: Tolerance | None,
    seconds: Sequence[dict[str, float]],
    notes: Sequence[list[str]],
    notify: Notify,
) -> list[list[NodeOutputVerdict]]:
    """Each judged node's outputs at each step: the candidate model, then the reference, each run at every step in
    turn and released after its last; `exposed` holds, per step, the original's tensors `models.exposed` names. A
    `tolerance` the user gave judges the values instead of the reference, which then does not run (the codes stay
    bit for bit)."""
    if models.candidate is None:
        return [[] for _ in feeds]
    sites = models.judged

    def fed(index: int, site: NodeSite, names: Sequence[str]) -> dict[str, np.ndarray]:
        return {site.fed(name): _original_value(feeds[index], exposed[index], name) for name in names}

    candidate = CpuSession(models.candidate, evaluator=evaluator)
    notify(loading_line(NODES_NAME, candidate))
    candidates = []
    with candidate:
        for index in range(len(feeds)):
            notify(f"{NODES_NAME}: {step_text(index, feeds)}")
            feed = {name: value for site in sites for name, value in fed(index, site, site.reads).items()}
            candidates.append(timed(seconds[index], "fused nodes", candidate.run, feed))
    references: list[Mapping[str, np.ndarray] | None] = [None] * len(feeds)
    if models.reference is not None and tolerance is None:
        reference = CpuSession(models.reference)
        notify(loading_line(REFERENCE_NAME, reference))
        try:
            with reference:
                for index in range(len(feeds)):
                    notify(f"{REFERENCE_NAME}: {step_text(index, feeds)}")
                    feed = {
                        name: value for site in sites for name, value in fed(index, site, site.reference_reads).items()
                    }
                    references[index] = timed(
                        seconds[index], "fused nodes' evaluation", reference.run, widened_feed(feed)
                    )
        except TrtfuseError as error:
            for step_notes in notes:
                step_notes.append(
                    f"no float32 evaluation of the original's ops at each fused node ({error}): each node's values "
                    "are judged within the tolerance of their dtype against the original's"
                )
    verdicts = []
    for index in range(len(feeds)):
        step = []
        for site in sites:
            for judged in site.outputs:
                names = (
                    judged.tensor,
                    judged.value,
                    *(product.original_dequantized for product in judged.products),
                    *(
                        [judged.normalised.tensor, judged.normalised.original_dequantized, judged.original_dequantized]
                        if judged.normalised is not None
                        else []
                    ),
                    *([judged.table] if judged.table is not None else []),
                    *(
                        [judged.rsqrt.original_dequantized, judged.original_dequantized]
                        if judged.rsqrt is not None
                        else []
                    ),
                )
                original_values = {name: _original_value(feeds[index], exposed[index], name) for name in names}
                step.append(
                    _judged(site, judged, candidates[index], original_values, references[index], models, tolerance)
                )
        verdicts.append(step)
    return verdicts


def _original_value(step: StepFeed, exposed: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return step.feed[name] if name in step.feed else exposed[name]


def _judged(
    site: NodeSite,
    judged: JudgedOutput,
    candidate: Mapping[str, np.ndarray],
    original: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray] | None,
    models: NodeModels,
    tolerance: Tolerance | None,
) -> NodeOutputVerdict:
    """One output judged: its codes against the original's quantizer of its values; its values within `tolerance`
    of the original's where one is given (or where the reference of a 16-bit or quantized original did not run:
    within their dtype's), else against the reference (the original's own values in a float32 original)."""
    node = {"node": site.name, "op": site.op, "tensor": judged.tensor, "value": judged.value}
    codes = None
    moved = _normalised_moved(judged, candidate, original)
    if judged.quantizer is not None:
        codes = _codes(judged, candidate, original[judged.tensor], _extra_steps(judged, moved, candidate, original))
    value, expected = np.asarray(candidate[judged.candidate_value]), np.asarray(original[judged.value])
    if value.shape != expected.shape:
        note = f"shape {_shape(value)}, the original's {_shape(expected)}"
        return NodeOutputVerdict(**node, values_passed=False, codes=codes, note=note)
    if moved is not None:
        # A product's value where the normalised value it multiplies moved a step is another product: judged in
        # the rotated output's sum bound, not here.
        value = np.where(_rows(moved, value.shape), expected, value)
    if judged.products and tolerance is None:
        bound = _sum_bound(judged, value, expected, candidate, original)
        return NodeOutputVerdict(**node, values_passed=bound.passed, codes=codes, bound=bound)
    if tolerance is not None or (reference is None and models.reference is not None):
        error = output_error(judged.value, value, expected, tolerance or tolerance_for(expected.dtype))
        return NodeOutputVerdict(**node, values_passed=error.passed, error=error, codes=codes)
    evaluation = expected if reference is None else np.asarray(reference[site.fed(judged.value)])
    errors = ReferenceErrors(rms_error(expected, evaluation), rms_error(value, evaluation), NODE_MARGIN)
    worst = _worst(value, expected, evaluation)
    # Values equal to the original's cannot be blamed, whatever the evaluation says.
    return NodeOutputVerdict(
        **node, values_passed=errors.passed or worst is None, errors=errors, worst=worst, codes=codes
    )


def _worst(value: np.ndarray, original: np.ndarray, reference: np.ndarray) -> Worst | None:
    """The element where `value` is furthest from `original` (NaN where the other is not counts as furthest); None
    where they are equal."""
    value64, original64 = value.astype(np.float64), original.astype(np.float64)
    same = (value64 == original64) | (np.isnan(value64) & np.isnan(original64))
    if same.all():
        return None
    distance = np.where(same, 0.0, np.abs(value64 - original64))
    distance = np.where(np.isnan(distance), math.inf, distance)
    flat = int(np.argmax(distance))
    index = tuple(int(position) for position in np.unravel_index(flat, value.shape))
    return Worst(index, float(value64[index]), float(original64[index]), float(reference.astype(np.float64)[index]))


def _sum_bound(
    judged: JudgedOutput,
    value: np.ndarray,
    expected: np.ndarray,
    candidate: Mapping[str, np.ndarray],
    original: Mapping[str, np.ndarray],
) -> SumBound:
    """The rotated output `value` against the original's `expected`, element by element: the sum of two products
    rounded to T differs from the original's by at most the products' differences (each DequantizeLinear's value
    the node's against the original's, at most one step each as the products' verdicts check) plus the two
    roundings to T, each half a unit in the last place (docs/cli.md, "Each fused node")."""
    value64, expected64 = value.astype(np.float64), expected.astype(np.float64)
    allowed = np.zeros(expected.shape)
    for product in judged.products:
        difference = np.abs(
            np.asarray(candidate[product.dequantized]).astype(np.float64)
            - np.asarray(original[product.original_dequantized]).astype(np.float64)
        )
        allowed += difference
    allowed += _ulp(np.maximum(np.abs(value64), np.abs(expected64)), expected.dtype)
    distance = np.abs(value64 - expected64)
    beyond = ~(distance <= allowed)
    dtype = np.dtype(expected.dtype).name
    differ = int((value64 != expected64).sum())
    if not beyond.any():
        return SumBound(dtype, value.size, differ, 0)
    first = tuple(int(position) for position in np.argwhere(beyond)[0])
    return SumBound(
        dtype,
        value.size,
        differ,
        int(beyond.sum()),
        first,
        float(value64[first]),
        float(expected64[first]),
        float(allowed[first]),
    )


def _ulp(magnitude: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One unit in the last place of `dtype` at each of `magnitude` (float64 values of that dtype): the spacing of
    its binade, the subnormals' below the smallest normal."""
    info = ml_dtypes.finfo(dtype)
    _, exponent = np.frexp(magnitude)
    return np.ldexp(1.0, np.maximum(exponent - 1, int(info.minexp)) - int(info.nmant))


def _code_values(codes: np.ndarray, dtype: str) -> np.ndarray:
    """Codes as the numbers they stand for: INT8 as integers, FP8 (onnxruntime gives its bytes) as E4M3FN values;
    codes given as float32 values (a product stage's, moved into the original's layout) as they are."""
    codes = np.asarray(codes)
    if dtype == "int8" or codes.dtype == np.float32:
        return codes.astype(np.float64)
    return np.ascontiguousarray(codes).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _ordinals(values: np.ndarray, dtype: str) -> np.ndarray:
    """Each code's place on its dtype's grid, counted from 0 (both zeros), negative below: INT8 codes are their
    own; an E4M3FN code's is its magnitude bits, signed."""
    if dtype == "int8":
        return values.astype(np.int64)
    bits = values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).astype(np.int64)
    return np.where(bits & 0x80, -(bits & 0x7F), bits & 0x7F)


def _normalised_moved(
    judged: JudgedOutput, candidate: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray]
) -> np.ndarray | None:
    """For a product after a normalised stage, where that stage's codes moved from the original's: per row of the
    last axis (a head row: each element's partner is in its own), True where one of its codes did; one value for
    all, whether any did, where the two are not of one shape. None for any other output."""
    stage = judged.normalised
    if stage is None:
        return None
    node, theirs = np.asarray(candidate[stage.candidate]), np.asarray(original[stage.tensor])
    dtype = stage.code_dtype or ""
    if node.shape != theirs.shape:
        return np.array(True)
    return (_code_values(node, dtype) != _code_values(theirs, dtype)).any(axis=-1, keepdims=True)


def _rows(moved: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`_normalised_moved`'s rows as a mask over a product of `shape`: those rows, or, in another layout than the
    product's (layout ops between the two stages), whether any moved."""
    return moved if not moved.ndim or moved.shape[:-1] == shape[:-1] else moved.any()


def _extra_steps(
    judged: JudgedOutput,
    moved: np.ndarray | None,
    candidate: Mapping[str, np.ndarray],
    original: Mapping[str, np.ndarray],
) -> np.ndarray | None:
    """The steps a rotation stage's codes may move beyond `PRODUCT_STEPS`, element by element, for what moved
    before them: the normalised stage's codes (`moved`, its rows: `_moved_row_steps`) and the rows' r'
    (`_rsqrt_steps`); None where nothing before them is quantized."""
    extra = []
    if moved is not None and judged.normalised is not None:
        extra.append(_moved_row_steps(judged, judged.normalised, moved, candidate, original))
    if judged.rsqrt is not None:
        extra.append(_rsqrt_steps(judged, judged.rsqrt, candidate, original))
    return sum(extra[1:], extra[0]) if extra else None


def _grid(
    judged: JudgedOutput, candidate: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """A stage's DQ values in the original, and its grid's spacing (in values) at the smaller of each element's
    two codes (the node's, the original's), the scale read off the original's codes; None where every code is 0."""
    dtype = judged.code_dtype or ""
    codes = _code_values(np.asarray(original[judged.tensor]), dtype)
    nonzero = codes != 0
    if not nonzero.any():
        return None
    dequantized = np.asarray(original[judged.original_dequantized or ""]).astype(np.float64)
    scale = float(np.median(np.abs(dequantized[nonzero] / codes[nonzero])))
    node = _code_values(np.asarray(candidate[judged.candidate]), dtype)
    smaller = np.where(np.sign(node) == np.sign(codes), np.minimum(np.abs(node), np.abs(codes)), 0.0)
    return dequantized, scale * _grid_spacing(smaller, dtype)


_UNBOUNDED = np.iinfo(np.int64).max // 4  # steps allowed where nothing bounds a move (two extras may add up)


def _moved_row_steps(
    judged: JudgedOutput,
    stage: JudgedOutput,
    moved: np.ndarray,
    candidate: Mapping[str, np.ndarray],
    original: Mapping[str, np.ndarray],
) -> np.ndarray:
    """For a product after a normalised `stage`: the steps of its grid a code may move beyond `PRODUCT_STEPS` in
    each row where that stage's codes moved (`moved`), 0 elsewhere. The graph multiplies the normalised value by a
    table entry t and quantizes: a normalised value d away moves the product at most d·|t| (d the row's largest
    move, |t| the table's largest), which is at most that many steps of the product's grid at the smaller of the
    two codes, plus one for the two roundings. Unbounded where the table is not known (a constant; no export has
    one) or the product's scale cannot be read off its codes (every code 0)."""
    theirs = np.asarray(original[judged.tensor])
    rows = _rows(moved, theirs.shape)
    drift = np.abs(
        np.asarray(candidate[stage.dequantized or ""]).astype(np.float64)
        - np.asarray(original[stage.original_dequantized or ""]).astype(np.float64)
    )
    drift = drift.max(axis=-1, keepdims=True) if drift.shape == theirs.shape else np.array(drift.max(initial=0.0))
    grid = _grid(judged, candidate, original)
    if judged.table is None or grid is None:
        return np.where(rows, _UNBOUNDED, 0)
    table = float(np.abs(np.asarray(original[judged.table]).astype(np.float64)).max(initial=0.0))
    steps = np.ceil(drift * table / grid[1]) + 1
    return np.where(rows, steps, 0).astype(np.int64)


def _rsqrt_steps(
    judged: JudgedOutput, stage: JudgedOutput, candidate: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray]
) -> np.ndarray:
    """For a stage after a part's rsqrt `stage` (its normalised stage, a product): the steps of its grid a code may
    move beyond `PRODUCT_STEPS` because a row's r' moved. Every value of a row is proportional to its r', so a
    relative move ρ of r' (the largest of any row) moves a value v by at most |v|·ρ, with |v| at most the original's
    DQ value plus a step: that many steps at the smaller of the two codes, plus one for the two roundings; none where
    no r' moved. Unbounded where the scale cannot be read off the codes (every code 0) or an r' of 0 moved."""
    ours = np.asarray(candidate[stage.dequantized or ""]).astype(np.float64)
    theirs = np.asarray(original[stage.original_dequantized or ""]).astype(np.float64)
    shape = np.asarray(original[judged.tensor]).shape
    if ours.size != theirs.size:
        return np.full(shape, _UNBOUNDED)
    ours, theirs = ours.reshape(-1), theirs.reshape(-1)
    moved = ours != theirs
    if not moved.any():
        return np.zeros(shape, dtype=np.int64)
    grid = _grid(judged, candidate, original)
    if grid is None or (theirs[moved] == 0).any():
        return np.full(shape, _UNBOUNDED)
    rho = float((np.abs(ours[moved] - theirs[moved]) / np.abs(theirs[moved])).max())
    dequantized, spacing = grid
    return (np.ceil((np.abs(dequantized) + spacing) * rho / spacing) + 1).astype(np.int64)


def _grid_spacing(magnitudes: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of a code dtype's grid at each of `magnitudes` (code values, not scaled): 1 for INT8; for E4M3FN
    its binade's (3 mantissa bits), the subnormals' below 2^-6."""
    if dtype == "int8":
        return np.ones_like(magnitudes)
    _, exponent = np.frexp(magnitudes)
    binade = np.where(magnitudes < 2.0**-6, -6, exponent - 1)
    return np.ldexp(1.0, binade - 3)


def _steps(judged: JudgedOutput, moved_codes: np.ndarray, original: np.ndarray, extra: np.ndarray | None) -> StepCheck:
    """How far a rotation stage's codes moved from the original's, in steps of their grid: at most `PRODUCT_STEPS`,
    plus `extra` where given (the rows where the normalised stage before it moved: `_moved_row_steps`)."""
    dtype = judged.code_dtype or ""
    node, theirs = _code_values(moved_codes, dtype), _code_values(original, dtype)
    distance = np.abs(_ordinals(node, dtype) - _ordinals(theirs, dtype))
    if not distance.size:
        return StepCheck(0)
    allowed = np.broadcast_to(PRODUCT_STEPS + (0 if extra is None else extra), distance.shape)
    beyond = distance - allowed
    if beyond.max() <= 0:
        farthest = np.unravel_index(int(np.argmax(distance)), distance.shape)
        return StepCheck(int(distance[farthest]), allowed=int(allowed[farthest]))
    index = tuple(int(position) for position in np.unravel_index(int(np.argmax(beyond)), distance.shape))
    return StepCheck(int(distance[index]), index, float(node[index]), float(theirs[index]), int(allowed[index]))


def _same_codes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Element by element, whether two arrays of one-byte codes hold the same bits."""
    return np.ascontiguousarray(first).view(np.uint8) == np.ascontiguousarray(second).view(np.uint8)


def _codes(
    judged: JudgedOutput, candidate: Mapping[str, np.ndarray], original: np.ndarray, extra: np.ndarray | None
) -> CodeCheck:
    codes, expected = np.asarray(candidate[judged.codes]), np.asarray(candidate[judged.requantized])
    dtype, quantizer = judged.code_dtype or "", judged.quantizer or ""
    moved_codes = np.asarray(candidate[judged.candidate])
    steps = None
    if moved_codes.shape != original.shape:
        moved = codes.size
    else:
        moved = int((_code_values(moved_codes, dtype) != _code_values(original, dtype)).sum())
        steps = _steps(judged, moved_codes, original, extra) if judged.is_stage else None
    if codes.shape != expected.shape:
        return CodeCheck(dtype, quantizer, codes.size, codes.size, moved, steps=steps)
    wrong = ~_same_codes(codes, expected)
    if not wrong.any():
        return CodeCheck(dtype, quantizer, codes.size, 0, moved, steps=steps)
    first = tuple(int(position) for position in np.argwhere(wrong)[0])
    value = float(np.asarray(candidate[judged.quantized or judged.candidate_value]).astype(np.float64)[first])
    code, quantized = (float(_code_values(array, dtype)[first]) for array in (codes, expected))
    return CodeCheck(dtype, quantizer, codes.size, int(wrong.sum()), moved, first, code, quantized, value, steps)


def _shape(array: np.ndarray) -> str:
    return "x".join(str(dim) for dim in array.shape) or "scalar"


def first_failure(steps: Sequence[tuple[str, Sequence[NodeOutputVerdict]]]) -> tuple[str, NodeOutputVerdict] | None:
    """The first node output that fails, in step order then graph order, with its step's name."""
    for name, verdicts in steps:
        for verdict in verdicts:
            if not verdict.passed:
                return name, verdict
    return None
