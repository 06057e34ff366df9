"""GPU: the quantizer stages of the RMSNorm and add+norm kernels, and the QK-norm's own quantizer of each output, bit
for bit against the contract's reference (trtfuse.bench.reference, itself bit for bit with onnxruntime), on fresh
random inputs (run on the H200).

The norm's own arithmetic is not bit-exact against float64 (tests/gpu/test_kernels_gpu.py holds it to a
tolerance), so what is exact is each stage given what reaches it:
- y's quantizer on chosen values: with x = 1 (or h = 0.5 + 0.5) and AFTER_CAST, R(x·r) is exactly 1 and y is the
  weight itself, so the weight puts any T value in front of the output quantizer: ties of every rounding, values
  just beside them, past the range, ±inf and NaN, for both saturate settings and both dtypes;
- on random rows: the quantized kernel's output is Q(y) of the plain kernel's y, compiled in the quantized
  variant's own tiling (the same code up to the store, the same order of the sum of squares), and with the input
  stage the plain kernel's y of DQ(Q(x)) (of DQ(Q(h)), h itself output unquantized); a QK-norm part's output is
  Q(y) through that part's own quantizer, or the plain kernel's y itself for a part without one;
- the inverse root's stage bit for bit against the reference on rows whose sum of squares is exact in float32 in
  any order (so r is one float32 value in the kernel, the graph and the reference), among them rows whose r lies
  within one float32 ulp of a step of its quantizer (where an approximate root would land on the next level).
Every quantized output is written twice over two poison patterns, which must give the same bytes: no element is
left unwritten (an INT8 or FP8 poison could be a valid value)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from trtfuse.contract import NormParams, Quantizer, QuantParams, WeightMode
from trtfuse.kernels import AddRmsNormSpec, QkNormSpec, RmsNormSpec, get_add_rms_norm, get_qk_norm, get_rms_norm
from trtfuse.kernels.api import shared_cache
from trtfuse.kernels.compiler import QkNormVariant, RmsNormVariant
from trtfuse.kernels.tiling import Regime

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import (  # noqa: E402  (needs torch)
    QUANT_TORCH_DTYPES,
    fake_quant_reference,
    norm_reference,
    quantize_reference,
)
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

AFTER, BEFORE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST
LLAMA = NormParams(1e-6, 0.0, AFTER)
EXACT_ONE = NormParams(0.0, 0.0, AFTER)  # x = 1: r = rsqrt(1) and R(1·r) = 1, so y = w
ROWS = (1, 133, 4097)  # decode, just past the SM count (prefill), a last wave of one row
POISONS = (0x5A, 0xA5)
HIDDEN = 4096


def f32(value: float) -> float:
    return float(np.float32(value))


@pytest.fixture(autouse=True)
def fresh_seed() -> None:
    print(f"torch seed {torch.seed()}")


def torch_dtype(name: str) -> torch.dtype:
    return QUANT_TORCH_DTYPES.get(name) or getattr(torch, name)


def rand(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    x *= torch.rand((*shape[:-1], 1), device="cuda") * 4 + 0.1
    return x.to(torch_dtype(dtype))


def buffer(shape: tuple[int, ...], dtype: str, offset: int) -> torch.Tensor:
    """An output `offset` elements past an aligned allocation (1: off the 16-byte vectors' alignment)."""
    count = int(np.prod(shape))
    return torch.empty(offset + count, device="cuda", dtype=torch_dtype(dtype))[offset:].view(shape)


def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    view = buffer(tuple(t.shape), str(t.dtype).removeprefix("torch."), offset)
    return view.copy_(t)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def written_twice(launch, out: torch.Tensor) -> torch.Tensor:
    """`launch()` over each poison byte pattern; the two results' bits must agree (every element written)."""
    results = []
    for poison in POISONS:
        out.view(torch.uint8).fill_(poison)
        launch()
        torch.cuda.synchronize()
        results.append(bits(out).clone())
    assert torch.equal(results[0], results[1]), "elements left unwritten (they kept the poison)"
    return out


def assert_same_bits(out: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    differing = bits(out) != bits(expected.to(out.dtype))
    if differing.any():
        where = differing.nonzero()[:8].tolist()
        shown = [(i, int(bits(out)[tuple(i)]), int(bits(expected.to(out.dtype))[tuple(i)])) for i in where]
        raise AssertionError(f"{what}: {int(differing.sum())} elements differ (index, ours, reference): {shown}")


def run_rms(spec: RmsNormSpec, x: torch.Tensor, w: torch.Tensor | None, offset: int) -> torch.Tensor:
    out = buffer(tuple(x.shape), spec.y_dtype, offset)
    kernel = get_rms_norm(spec)
    return written_twice(lambda: kernel(x, w, out), out)


def run_add(spec: AddRmsNormSpec, x: torch.Tensor, residual: torch.Tensor, w, offset: int):
    out = buffer(tuple(x.shape), spec.y_dtype, offset)
    h = buffer(tuple(x.shape), spec.dtype, offset)
    kernel = get_add_rms_norm(spec)
    return written_twice(lambda: kernel(x, residual, w, out, h), out), h


# --- the output quantizer on chosen values ---------------------------------------------------------------------------


def e4m3_values() -> np.ndarray:
    """Every finite non-negative E4M3FN value, from its codes."""
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


def chosen_quotients(quantizer: Quantizer) -> np.ndarray:
    """Quotients v / s at and beside every rounding tie of the quantized dtype, at and past its range's ends."""
    if quantizer.dtype == "int8":
        ties = np.arange(-131, 131) + 0.5
        edges = np.array([127.0, 127.5, 128.0, 128.5, 129.0, 1e4, -128.0, -128.5, -129.0, -129.5, -1e4])
    else:
        values = e4m3_values()
        ties = (values[1:] + values[:-1]) / 2
        ties = np.concatenate([ties, -ties, [448.0, 456.0, 464.0, 470.0, 480.0, 490.0, 496.0, 500.0, 1e4]])
        edges = np.concatenate([-ties[-9:], [2.0**-10, 2.0**-11, -(2.0**-10)]])
    near = np.concatenate([ties * (1 + 2.0**-12), ties * (1 - 2.0**-12)])
    return np.concatenate([ties, edges, near, [0.0, -0.0]])


def y_values(quantizer: Quantizer, t_dtype: str) -> torch.Tensor:
    """HIDDEN values of T: the chosen quotients times the scale (rounded to T: exact ties for a power-of-two
    scale, ties broken by the rounding of v / s for another), ±inf and NaN, then random ones."""
    chosen = np.concatenate([chosen_quotients(quantizer) * quantizer.scale, [np.inf, -np.inf, np.nan]])
    assert len(chosen) < HIDDEN
    rest = np.random.default_rng().standard_normal(HIDDEN - len(chosen)) * 100 * quantizer.scale
    values = torch.tensor(np.concatenate([chosen, rest]), dtype=torch.float32, device="cuda")
    return values.to(getattr(torch, t_dtype))


QUANTIZERS = [
    Quantizer(dtype, scale, saturate)
    for dtype, saturate in (("float8_e4m3fn", True), ("float8_e4m3fn", False), ("int8", True))
    for scale in (2.0**-5, f32(0.0173))
]
# (x's dtype, T): a 16-bit row in its own dtype, and a bf16 row normalised to float32 (R = bf16, so y = w still).
Y_PAIRS = (("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32"))


# Every quantizer on RMSNorm's three pairs and on the add+norm's bf16 rows.
Y_CASES = [
    (kind, dtype, t_dtype)
    for kind in ("rms", "add")
    for dtype, t_dtype in Y_PAIRS
    if kind == "rms" or dtype == t_dtype == "bfloat16"
]


@pytest.mark.parametrize("quantizer", QUANTIZERS, ids=repr)
@pytest.mark.parametrize(("kind", "dtype", "t_dtype"), Y_CASES)
def test_y_quantizer_equals_the_reference_on_ties_edges_and_specials(
    quantizer: Quantizer, kind: str, dtype: str, t_dtype: str
) -> None:
    """Decode, prefill and unaligned (element path) launches; the plain kernel's y is checked to be w first (a NaN
    comes out as the kernel's canonical NaN)."""
    w = y_values(quantizer, t_dtype)
    nan = w.isnan()
    quant = QuantParams(output=quantizer)
    for rows, offset in ((1, 0), (133, 0), (133, 1)):
        if kind == "rms":
            x = shifted(torch.ones(rows, HIDDEN, device="cuda", dtype=getattr(torch, dtype)), offset)
            y = run_rms(RmsNormSpec(HIDDEN, dtype, t_dtype, EXACT_ONE, t_dtype), x, w, offset)
            out = run_rms(RmsNormSpec(HIDDEN, dtype, t_dtype, EXACT_ONE, t_dtype, quant), x, w, offset)
        else:
            x = shifted(torch.full((rows, HIDDEN), 0.5, device="cuda", dtype=getattr(torch, dtype)), offset)
            y, _ = run_add(AddRmsNormSpec(HIDDEN, dtype, t_dtype, EXACT_ONE, t_dtype), x, x, w, offset)
            out, _ = run_add(AddRmsNormSpec(HIDDEN, dtype, t_dtype, EXACT_ONE, t_dtype, quant), x, x, w, offset)
        assert_same_bits(y[:, ~nan], w[~nan].expand(rows, -1), "the plain kernel's y (the premise y = w)")
        assert y[:, nan].isnan().all()
        assert_same_bits(out, quantize_reference(y, quantizer), f"Q(y), rows={rows} offset={offset}")


# --- random rows: each stage given what reaches it -------------------------------------------------------------------

FP8 = Quantizer("float8_e4m3fn", f32(0.0173))
FP8_UNSATURATED = Quantizer("float8_e4m3fn", f32(0.0071), saturate=False)  # some |y| / s past 464
INT8 = Quantizer("int8", f32(0.0311))
PAIRS = (
    ("bfloat16", "bfloat16"),
    ("float16", "float16"),
    ("float32", "float32"),
    ("float32", "bfloat16"),
    ("float32", "float16"),
    ("bfloat16", "float32"),
    ("float16", "float32"),
)


def input_quantizer(dtype: str, quantized: str) -> Quantizer:
    """ModelOpt's pair on the normalised tensor: dequantized to the activations' dtype."""
    return Quantizer(quantized, f32(0.047), True, dtype)


def stage_sets(dtype: str) -> dict[str, QuantParams]:
    return {
        "out-fp8": QuantParams(output=FP8),
        "out-fp8-unsat": QuantParams(output=FP8_UNSATURATED),
        "out-int8": QuantParams(output=INT8),
        "in-fp8-out-fp8": QuantParams(input=input_quantizer(dtype, "float8_e4m3fn"), output=FP8),
        "in-int8-out-int8": QuantParams(input=input_quantizer(dtype, "int8"), output=INT8),
        "in-fp8": QuantParams(input=input_quantizer(dtype, "float8_e4m3fn")),
    }


def plain_y(spec: RmsNormSpec | AddRmsNormSpec, v: torch.Tensor, w: torch.Tensor | None, aligned: bool) -> torch.Tensor:
    """The plain RMSNorm's y of `v` (x, or the add+norm's h) in the tiling the quantized `spec` runs for v's rows and
    alignment, launched as the plugins launch (raw pointers)."""
    kernel = get_add_rms_norm(spec) if isinstance(spec, AddRmsNormSpec) else get_rms_norm(spec)
    rows = v.numel() // spec.hidden
    regime = Regime.DECODE if rows <= kernel.device.sm_count else Regime.PREFILL
    tiling = kernel.variant(regime, aligned).tiling
    plain = RmsNormSpec(spec.hidden, spec.dtype, spec.weight_dtype, spec.params, spec.out_dtype)
    function = shared_cache().get(RmsNormVariant(plain, tiling, kernel.device.arch))
    y = torch.empty(tuple(v.shape), device="cuda", dtype=getattr(torch, spec.out_dtype))
    v = v.contiguous()
    function(
        v.data_ptr(), 0 if w is None else w.data_ptr(), y.data_ptr(), rows, torch.cuda.current_stream().cuda_stream
    )
    torch.cuda.synchronize()
    return y


def expected(
    spec: RmsNormSpec | AddRmsNormSpec, v: torch.Tensor, w: torch.Tensor | None, aligned: bool
) -> torch.Tensor:
    """What the quantized kernel must give: the plain kernel's y of DQ(Q(v)) (of v with the input stage off),
    then Q(y) with the output stage on."""
    quant = spec.quant
    if quant.input is not None:
        v = fake_quant_reference(v, quant.input)
    y = plain_y(spec, v, w, aligned)
    return y if quant.output is None else quantize_reference(y, quant.output)


# Every stage set on bf16 rows of both kernels, then each other dtype pair with two of them.
STAGE_SETS = ("out-fp8", "out-fp8-unsat", "out-int8", "in-fp8-out-fp8", "in-int8-out-int8", "in-fp8")
RANDOM_CASES = [(kind, "bfloat16", "bfloat16", stages) for kind in ("rms", "add") for stages in STAGE_SETS] + [
    (kind, dtype, t_dtype, stages)
    for dtype, t_dtype in PAIRS[1:]
    for kind, stages in (("rms", "out-int8"), ("add", "in-fp8-out-fp8"))
]


@pytest.mark.parametrize(("kind", "dtype", "t_dtype", "stages"), RANDOM_CASES)
def test_random_rows_equal_the_plain_kernels_y_through_the_reference_quantizers(
    kind: str, dtype: str, t_dtype: str, stages: str
) -> None:
    """Decode, prefill and a last wave of one row, aligned (16-byte vectors) and one element off (the element
    path), alternating Llama's and Gemma's weight modes."""
    quant = stage_sets(dtype)[stages]
    weight = "bfloat16" if "bfloat16" in (dtype, t_dtype) else "float16"
    for (rows, offset), params in zip(
        itertools.product(ROWS, (0, 1)), itertools.cycle((LLAMA, NormParams(1e-6, 1.0, BEFORE)))
    ):
        w = shifted(rand((HIDDEN,), weight), offset)
        x = shifted(rand((rows, HIDDEN), dtype), offset)
        what = f"{kind} {stages} rows={rows} offset={offset} {params.weight_mode.name}"
        if kind == "rms":
            spec = RmsNormSpec(HIDDEN, dtype, weight, params, t_dtype, quant)
            assert_same_bits(run_rms(spec, x, w, offset), expected(spec, x, w, offset == 0), what)
        else:
            spec = AddRmsNormSpec(HIDDEN, dtype, weight, params, t_dtype, quant)
            residual = shifted(rand((rows, HIDDEN), dtype), offset)
            out, h = run_add(spec, x, residual, w, offset)
            sum_ = (x.float() + residual.float()).to(x.dtype)
            assert_same_bits(h, sum_, "h = D(x + residual), unquantized")
            assert_same_bits(out, expected(spec, sum_, w, offset == 0), what)


@pytest.mark.parametrize("hidden", [128, 1000, 1001, 5120])
def test_other_row_widths(hidden: int) -> None:
    """Head-dim rows (one vector per lane), ragged rows, rows no vector divides (the element path alone)."""
    quant = QuantParams(input=input_quantizer("bfloat16", "float8_e4m3fn"), output=FP8_UNSATURATED)
    spec = RmsNormSpec(hidden, "bfloat16", "bfloat16", LLAMA, quant=quant)
    for rows in ROWS:
        x, w = rand((rows, hidden), "bfloat16"), rand((hidden,), "bfloat16")
        assert_same_bits(run_rms(spec, x, w, 0), expected(spec, x, w, True), f"H={hidden} rows={rows}")


# --- QK-norm: each part's own output quantizer ------------------------------------------------------------------------

QK_TOKENS = (1, 7, 300)
INT8_K = Quantizer("int8", f32(0.0173))
QK_STAGE_SETS = {
    "q-int8": QuantParams(q_output=INT8),
    "q-fp8": QuantParams(q_output=FP8),
    "k-int8": QuantParams(k_output=INT8),
    "k-fp8": QuantParams(k_output=FP8_UNSATURATED),
    "both-int8": QuantParams(q_output=INT8, k_output=INT8_K),  # Gemma3 INT8's two scales
    "both-fp8": QuantParams(q_output=FP8, k_output=FP8_UNSATURATED),
    "q-int8-k-fp8": QuantParams(q_output=INT8, k_output=FP8),
}
# (q_hidden, k_hidden, q heads, k heads): head dims with GQA head counts, and rows of widths no power of two, one each
# per token, like DeepSeek-V3's latent ones (1536 and 512).
QK_SHAPES = ((128, 128, 8, 2), (64, 64, 4, 4), (48, 32, 1, 1))


def run_qk(
    spec: QkNormSpec, q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, offset: int
) -> list[torch.Tensor]:
    """(q_out, k_out), each in the dtype its part stores, `offset` elements off alignment, each written twice."""
    outs = [buffer(tuple(t.shape), spec.part_y_dtype(part), offset) for part, t in enumerate((q, k))]
    kernel = get_qk_norm(spec)
    for out in outs:
        written_twice(lambda: kernel(q, k, wq, wk, *outs), out)
    return outs


def plain_qk(
    spec: QkNormSpec, q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, aligned: bool
) -> list[torch.Tensor]:
    """The plain QK-norm's (q_out, k_out) in T, in the tilings the quantized `spec` runs for this alignment (each
    part's in its own stored dtype), launched as the plugins launch (raw pointers)."""
    kernel = get_qk_norm(spec)
    variant = kernel.variant(aligned)
    plain = dataclasses.replace(spec, quant=None)
    function = shared_cache().get(QkNormVariant(plain, variant.q_tiling, variant.k_tiling, kernel.device.arch))
    outs = [torch.empty(tuple(t.shape), device="cuda", dtype=getattr(torch, spec.out_dtype)) for t in (q, k)]
    pointers = [t.data_ptr() for t in (q, k, wq, wk, *outs)]
    rows = (q.numel() // spec.q_hidden, k.numel() // spec.k_hidden)
    function(*pointers, *rows, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return outs


# Every stage set on bf16 rows of every shape, then other dtype pairs (x's, T's).
QK_CASES = [(shape, stages, "bfloat16", "bfloat16") for shape in QK_SHAPES for stages in QK_STAGE_SETS] + [
    (QK_SHAPES[0], "both-int8", "float16", "float16"),
    (QK_SHAPES[1], "q-int8-k-fp8", "float32", "bfloat16"),
    (QK_SHAPES[2], "q-fp8", "float32", "float32"),
]


@pytest.mark.parametrize(("shape", "stages", "dtype", "t_dtype"), QK_CASES)
def test_qk_norm_parts_equal_the_plain_kernels_y_through_their_own_quantizers(
    shape: tuple[int, int, int, int], stages: str, dtype: str, t_dtype: str
) -> None:
    """Each part's output is Q(y) of the plain QK-norm's y through that part's own quantizer, or the plain y in T
    for a part without one: 1, 7 and 300 tokens, Gemma's and Llama's weight modes, each aligned (16-byte vectors)
    and one element off (the element path)."""
    q_hidden, k_hidden, q_heads, k_heads = shape
    weight = "bfloat16" if "bfloat16" in (dtype, t_dtype) else "float16"
    for tokens, params in zip(QK_TOKENS, itertools.cycle((NormParams(1e-6, 1.0, BEFORE), LLAMA))):
        spec = QkNormSpec(q_hidden, k_hidden, dtype, weight, params, t_dtype, QK_STAGE_SETS[stages])
        for offset in (0, 1):
            q = shifted(rand((tokens, q_heads, q_hidden), dtype), offset)
            k = shifted(rand((tokens, k_heads, k_hidden), dtype), offset)
            wq, wk = (shifted(rand((hidden,), weight), offset) for hidden in (q_hidden, k_hidden))
            outs = run_qk(spec, q, k, wq, wk, offset)
            for part, (out, y) in enumerate(zip(outs, plain_qk(spec, q, k, wq, wk, offset == 0), strict=True)):
                quant = spec.part_quant(part)
                what = f"{'qk'[part]}_out {stages} tokens={tokens} offset={offset} {params.weight_mode.name}"
                assert_same_bits(out, y if quant is None else quantize_reference(y, quant.output), what)


# ModelOpt INT8's pairs on the inverse root: of a float32 r (fp32 exports), and of r cast to float16 first (fp16).
RSQRT_QUANTIZERS = (
    Quantizer("int8", f32(0.05), True, "float32", "float32"),
    Quantizer("int8", f32(0.05), True, "float16", "float16"),
)
# x = m / 128 with integers |m| <= 63: each square is a multiple of 2^-14 and a row's sum stays below 2^10, so every
# partial sum of squares is exact in float32 (24 bits), in any order. S = sum of m² sets the row's r.
EXACT_STEP, M_MAX = 128, 63


def rsqrt_steps(quantizer: Quantizer, epsilon: float, sums: np.ndarray) -> np.ndarray:
    """The r' level of each sum S (the row's mean of squares S / (128² · HIDDEN) exactly), with r computed as the
    graph computes it in float32 (numpy's float32 sqrt and division are IEEE), for r and its two float32
    neighbours: an array (3, len(sums))."""
    variance = (sums / float(EXACT_STEP**2 * HIDDEN)).astype(np.float32) + np.float32(epsilon)
    r = np.float32(1) / np.sqrt(variance)
    neighbours = (r, np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(0)))
    read = [v.astype(quantizer.input_dtype).astype(np.float32) for v in neighbours]
    return np.stack([np.clip(np.rint(v / np.float32(quantizer.scale)), -128, 127) for v in read])


def sums_at_steps(quantizer: Quantizer, epsilon: float) -> np.ndarray:
    """Sums S whose r lies within one ulp of a step of the quantizer (not clipped): an r one ulp off, either way,
    lands on the neighbouring level for one of them."""
    sums = np.arange(2_000_000, 6_000_000, dtype=np.int64)  # r / s from about 120 down to 70
    levels = rsqrt_steps(quantizer, epsilon, sums)
    at_step = ((levels[1] != levels[0]) | (levels[2] != levels[0])) & (np.abs(levels[0]) < 127)
    return sums[at_step]


def squares_summing_to(total: int, rng: np.random.Generator) -> np.ndarray:
    """HIDDEN integers in [-M_MAX, M_MAX] whose squares sum to `total`: as many of M_MAX as fit, then greedy
    squares of the rest, zeros, shuffled with random signs."""
    full, rest = divmod(total, M_MAX**2)
    parts = [M_MAX] * full
    while rest:
        parts.append(math.isqrt(rest))
        rest -= parts[-1] ** 2
    assert len(parts) <= HIDDEN
    m = np.zeros(HIDDEN, dtype=np.int64)
    m[: len(parts)] = parts
    return rng.permutation(m) * rng.choice([-1, 1], HIDDEN)


def exact_sum_rows(rows: int, at_steps: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """bf16 rows of m / 128: first (up to half the rows, at least one) rows of the sums `at_steps`, then rows of
    random m of random ranges (r spread over the quantizer's levels)."""
    chosen = rng.permutation(at_steps)[: max(1, rows // 2)]
    m = [squares_summing_to(int(total), rng) for total in chosen]
    for bound in rng.integers(20, M_MAX + 1, rows - len(m)):
        m.append(rng.integers(-bound, bound + 1, HIDDEN))
    return (torch.tensor(np.stack(m), dtype=torch.float32, device="cuda") / EXACT_STEP).to(torch.bfloat16)


@pytest.mark.parametrize("quantizer", RSQRT_QUANTIZERS, ids=repr)
@pytest.mark.parametrize("kind", ["rms", "add"])
def test_the_inverse_roots_stage_equals_the_reference_bit_for_bit(quantizer: Quantizer, kind: str) -> None:
    """r' = DQ(Q(I(r))) per row, r the graph's correctly rounded Sqrt then Reciprocal: on rows of exact sums y =
    float32(x · r') is the reference's bit for bit (weight mode NONE, T = float32: one rounding of an exact
    product), rows at a step of the quantizer included; with Llama's weight and a bf16 y, within the kernels'
    tolerance on every row. The add+norm's x and residual are both h / 2, so that h = D(x + residual) is the row."""
    quant = QuantParams(rsqrt=quantizer)
    at_steps = sums_at_steps(quantizer, LLAMA.epsilon)
    assert len(at_steps) >= 32
    exact = NormParams(LLAMA.epsilon, 0.0, WeightMode.NONE)
    rng = np.random.default_rng(torch.initial_seed())
    for rows in ROWS:
        v = exact_sum_rows(rows, at_steps, rng)
        w = rand((HIDDEN,), "bfloat16")
        for params, weight, t_dtype in ((exact, None, "float32"), (LLAMA, w, "bfloat16")):
            weight_dtype = None if weight is None else "bfloat16"
            if kind == "rms":
                y = get_rms_norm(RmsNormSpec(HIDDEN, "bfloat16", weight_dtype, params, t_dtype, quant))(v, weight)
            else:
                spec = AddRmsNormSpec(HIDDEN, "bfloat16", weight_dtype, params, t_dtype, quant)
                y, h = get_add_rms_norm(spec)(v / 2, v / 2, weight)
                assert_same_bits(h, v, "h = D(x + residual)")
            torch.cuda.synchronize()
            reference = norm_reference(v, weight, params, t_dtype, quant)
            what = f"{kind} rows={rows} {params.weight_mode.name}"
            if weight is None:
                assert_same_bits(y, reference, what)
            else:
                rtol, atol = KERNEL_ELEMENTWISE["bfloat16"]
                torch.testing.assert_close(y.double(), reference.double(), rtol=rtol, atol=atol, msg=what)


@pytest.mark.parametrize("input_dtype", ["float32", "float16"])
def test_each_qk_norm_parts_inverse_root_stage_equals_the_reference_bit_for_bit(input_dtype: str) -> None:
    """OLMo2's INT8 q and k norms in one launch, each with its own inverse-root quantizer (two scales): on rows of
    exact sums each part's y = float32(x · r') is the reference's through that part's own quantizer bit for bit
    (weight mode NONE, T = float32), rows at a step of each part's quantizer included."""
    q_rsqrt = Quantizer("int8", f32(0.05), True, input_dtype, input_dtype)
    k_rsqrt = Quantizer("int8", f32(0.0625), True, input_dtype, input_dtype)
    exact = NormParams(LLAMA.epsilon, 0.0, WeightMode.NONE)
    spec = QkNormSpec(HIDDEN, HIDDEN, "bfloat16", None, exact, "float32", QuantParams(q_rsqrt=q_rsqrt, k_rsqrt=k_rsqrt))
    rng = np.random.default_rng(torch.initial_seed())
    for rows in ROWS:
        q = exact_sum_rows(rows, sums_at_steps(q_rsqrt, exact.epsilon), rng)
        k = exact_sum_rows(max(1, rows // 3), sums_at_steps(k_rsqrt, exact.epsilon), rng)
        outs = get_qk_norm(spec)(q, k)
        torch.cuda.synchronize()
        for part, (x, out) in enumerate(zip((q, k), outs, strict=True)):
            reference = norm_reference(x, None, exact, "float32", spec.part_quant(part))
            assert_same_bits(out, reference, f"{'qk'[part]}_out rows={rows}")


def test_raw_pointer_launch_of_a_quantized_add_norm_replays_from_a_cuda_graph() -> None:
    """The plugin's path: warm up, capture a raw-pointer launch on a side stream, replay on new inputs."""
    quant = QuantParams(input=input_quantizer("bfloat16", "float8_e4m3fn"), output=FP8)
    spec = AddRmsNormSpec(HIDDEN, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, AFTER), quant=quant)
    kernel = get_add_rms_norm(spec)
    kernel.warm_up(max_rows=4096)
    rows = 32
    x, residual, w = rand((rows, HIDDEN), "bfloat16"), rand((rows, HIDDEN), "bfloat16"), rand((HIDDEN,), "bfloat16")
    y, h = buffer((rows, HIDDEN), spec.y_dtype, 0), buffer((rows, HIDDEN), "bfloat16", 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        kernel.launch(
            x.data_ptr(),
            residual.data_ptr(),
            w.data_ptr(),
            y.data_ptr(),
            h.data_ptr(),
            rows,
            torch.cuda.current_stream().cuda_stream,
        )
    for _ in range(2):
        x.copy_(rand((rows, HIDDEN), "bfloat16"))
        residual.copy_(rand((rows, HIDDEN), "bfloat16"))
        written_twice(graph.replay, y)
        sum_ = (x.float() + residual.float()).to(x.dtype)
        assert_same_bits(h, sum_, "h")
        assert_same_bits(y, expected(spec, sum_, w, True), "y")
