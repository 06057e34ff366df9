"""GPU: the kernels against a float64 reference on fresh random inputs, with poisoned outputs (run on the H200)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels import QkNormSpec, RmsNormSpec, get_qk_norm, get_rms_norm
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import norm_reference  # noqa: E402  (needs torch)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
DTYPES = ("float32", "float16", "bfloat16")
HIDDENS = (64, 128, 1000, 2048, 4096, 5120, 8192)
ROWS = (1, 3, 64, 4096)


@pytest.fixture(autouse=True)
def fresh_seed() -> None:
    """A new random seed per test, printed so a failure can be replayed with torch.manual_seed."""
    print(f"torch seed {torch.seed()}")


def dt(name: str) -> torch.dtype:
    return getattr(torch, name)


def rand(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """Fresh random inputs on every call (N(0, 1) scaled by a random per-row magnitude, so rows differ in size)."""
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    x *= torch.rand((*shape[:-1], 1), device="cuda") * 4 + 0.1
    return x.to(dt(dtype))


def poisoned(shape: tuple[int, ...], dtype: str, offset: int = 0) -> torch.Tensor:
    """NaN-filled output, optionally starting `offset` elements into its buffer (a pointer off 16-byte alignment)."""
    buf = torch.full((offset + int(torch.tensor(shape).prod()),), float("nan"), device="cuda", dtype=dt(dtype))
    return buf[offset:].view(shape)


def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `t` whose data pointer is `offset` elements past an aligned allocation."""
    if offset == 0:
        return t
    buf = torch.empty(offset + t.numel(), device=t.device, dtype=t.dtype)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


def assert_matches(y: torch.Tensor, ref: torch.Tensor, rounded_to: str | None = None) -> None:
    """`rounded_to`: a coarser dtype the value passed through on its way to y's (AFTER_CAST's R), whose units in the
    last place then set the tolerance: the kernel's fp32 x·r and the float64 one may round to neighbours there."""
    assert not torch.isnan(y).any(), "output has unwritten (NaN-poisoned) or NaN elements"
    rtol, atol = max(
        KERNEL_ELEMENTWISE[str(y.dtype).removeprefix("torch.")], KERNEL_ELEMENTWISE[rounded_to or "float32"]
    )
    torch.testing.assert_close(y.double(), ref.double(), rtol=rtol, atol=atol)


def rounded(spec: RmsNormSpec | QkNormSpec) -> str | None:
    """AFTER_CAST's intermediate dtype R where it is 16-bit, else None (contract.rounding_dtype)."""
    if spec.params.weight_mode is not AFTER:
        return None
    return spec.dtype if spec.dtype != "float32" else spec.out_dtype


def run_rms(spec: RmsNormSpec, rows: int, misalign: int = 0) -> None:
    x = shifted(rand((rows, spec.hidden), spec.dtype), misalign)
    w = None if spec.weight_dtype is None else shifted(rand((spec.hidden,), spec.weight_dtype), misalign)
    out = poisoned((rows, spec.hidden), spec.out_dtype, misalign)
    y = get_rms_norm(spec)(x, w, out)
    torch.cuda.synchronize()
    assert y.data_ptr() == out.data_ptr() and y.dtype == dt(spec.out_dtype)
    assert_matches(y, norm_reference(x, w, spec.params, spec.out_dtype), rounded(spec))


DTYPE_PAIR_SPECS = [
    RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode))
    for act, wdt in itertools.product(DTYPES, DTYPES)
    for mode, offset in ((AFTER, 0.0), (BEFORE, 1.0))
] + [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, NONE)) for act in DTYPES]


@pytest.mark.parametrize("spec", DTYPE_PAIR_SPECS, ids=repr)
def test_rms_norm_every_dtype_pair_and_mode(spec: RmsNormSpec) -> None:
    for rows in ROWS:
        run_rms(spec, rows)


@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize(
    ("dtype", "weight_dtype", "offset", "mode"),
    [("bfloat16", "bfloat16", 0.0, AFTER), ("float16", "float32", 1.0, BEFORE), ("float32", "bfloat16", 1.0, AFTER)],
)
def test_rms_norm_every_hidden_size(
    hidden: int, dtype: str, weight_dtype: str, offset: float, mode: WeightMode
) -> None:
    spec = RmsNormSpec(hidden, dtype, weight_dtype, NormParams(1e-6, offset, mode))
    for rows in ROWS:
        run_rms(spec, rows)


@pytest.mark.parametrize(
    "spec",
    [
        RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 1.0, BEFORE)),
        RmsNormSpec(8192, "bfloat16", "float16", NormParams(1e-5, 0.0, AFTER)),
        RmsNormSpec(8192, "float16", None, NormParams(1e-6, 0.0, NONE)),
        RmsNormSpec(5120, "float16", "float16", NormParams(1e-6, 1.0, AFTER)),
        RmsNormSpec(3000, "bfloat16", None, NormParams(1e-6, 0.0, NONE)),
    ],
    ids=repr,
)
def test_rms_norm_prefill_reading_x_twice(spec: RmsNormSpec) -> None:
    """Prefill rows of 16-bit x read twice (with cache policies), ragged or not, in every mode; 4097 rows leave one
    row in the last wave."""
    for rows in (133, 4097):
        run_rms(spec, rows)


@pytest.mark.parametrize("hidden", [1001, 4096])
@pytest.mark.parametrize("misalign", [1, 2])
def test_rms_norm_unaligned_pointers_take_the_scalar_variant(hidden: int, misalign: int) -> None:
    spec = RmsNormSpec(hidden, "bfloat16", "float32", NormParams(1e-6, 0.0, AFTER))
    for rows in ROWS:
        run_rms(spec, rows, misalign)


def test_rms_norm_zero_rows_is_a_no_op() -> None:
    spec = RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    x = rand((0, 4096), "bfloat16")
    get_rms_norm(spec)(x, rand((4096,), "bfloat16"))
    torch.cuda.synchronize()


def test_raw_pointer_launch_on_a_side_stream_replays_from_a_cuda_graph() -> None:
    """What a plugin does: warm up, then launch on raw pointers and TensorRT's stream inside a graph capture.

    The spec (its epsilon) is used by no other test, so the capture is the first launch after warm-up."""
    spec = RmsNormSpec(4096, "float16", "float32", NormParams(3e-6, 0.0, AFTER))
    kernel = get_rms_norm(spec)
    kernel.warm_up(max_rows=4096)
    rows = 32
    x, w = rand((rows, 4096), "float16"), rand((4096,), "float32")
    out = poisoned((rows, 4096), "float16")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        kernel.launch(x.data_ptr(), w.data_ptr(), out.data_ptr(), rows, torch.cuda.current_stream().cuda_stream)
    for _ in range(2):
        x.copy_(rand((rows, 4096), "float16"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, norm_reference(x, w, NormParams(3e-6, 0.0, AFTER)))


def test_qk_norm_raw_pointer_launch_replays_from_a_cuda_graph() -> None:
    spec = QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, AFTER))
    kernel = get_qk_norm(spec)
    kernel.warm_up(max_rows=4096)
    q, k = rand((4, 32, 128), "bfloat16"), rand((4, 8, 128), "bfloat16")
    wq, wk = rand((128,), "bfloat16"), rand((128,), "bfloat16")
    q_out, k_out = poisoned((4, 32, 128), "bfloat16"), poisoned((4, 8, 128), "bfloat16")
    pointers = (q.data_ptr(), k.data_ptr(), wq.data_ptr(), wk.data_ptr(), q_out.data_ptr(), k_out.data_ptr())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        kernel.launch(*pointers, 4 * 32, 4 * 8, torch.cuda.current_stream().cuda_stream)
    q.copy_(rand((4, 32, 128), "bfloat16"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(q_out, norm_reference(q, wq, NormParams(3e-6, 0.0, AFTER)))
    assert_matches(k_out, norm_reference(k, wk, NormParams(3e-6, 0.0, AFTER)))


def run_qk(spec: QkNormSpec, tokens: int, q_heads: int, k_heads: int, misalign: int = 0) -> None:
    q = shifted(rand((tokens, q_heads, spec.q_hidden), spec.dtype), misalign)
    k = shifted(rand((tokens, k_heads, spec.k_hidden), spec.dtype), misalign)
    wq = wk = None
    if spec.weight_dtype is not None:
        wq, wk = rand((spec.q_hidden,), spec.weight_dtype), rand((spec.k_hidden,), spec.weight_dtype)
    q_out = poisoned(tuple(q.shape), spec.out_dtype)
    k_out = poisoned(tuple(k.shape), spec.out_dtype)
    get_qk_norm(spec)(q, k, wq, wk, q_out, k_out)
    torch.cuda.synchronize()
    assert_matches(q_out, norm_reference(q, wq, spec.params, spec.out_dtype), rounded(spec))
    assert_matches(k_out, norm_reference(k, wk, spec.params, spec.out_dtype), rounded(spec))


QK_CASES = [
    ("qwen3", QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), 32, 8),
    ("gemma3", QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, BEFORE)), 8, 4),
    ("head64", QkNormSpec(64, 64, "float16", "float16", NormParams(1e-5, 0.0, AFTER)), 16, 16),
    ("no-weight", QkNormSpec(128, 128, "float32", None, NormParams(1e-6, 0.0, NONE)), 8, 2),
    ("olmo2", QkNormSpec(4096, 1024, "bfloat16", "float32", NormParams(1e-6, 0.0, BEFORE)), 1, 1),
    ("wide-ragged", QkNormSpec(8192, 5120, "float16", "float16", NormParams(1e-6, 1.0, AFTER)), 1, 1),
]


@pytest.mark.parametrize(("name", "spec", "q_heads", "k_heads"), QK_CASES, ids=[c[0] for c in QK_CASES])
def test_qk_norm_matches_two_reference_norms(name: str, spec: QkNormSpec, q_heads: int, k_heads: int) -> None:
    for tokens in ROWS:
        run_qk(spec, tokens, q_heads, k_heads)


def test_qk_norm_unaligned_pointers() -> None:
    spec = QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    for tokens in (1, 3, 64):
        run_qk(spec, tokens, 32, 8, misalign=1)


# --- mixed precision: x and y of different dtypes (contract: output_dtype) ------------------------------------------

MIXED_PAIRS = (("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"))


def sixteen_bit_side(dtype: str, out_dtype: str) -> str:
    return dtype if dtype != "float32" else out_dtype


MIXED_SPECS = [
    RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode), out)
    for act, out in MIXED_PAIRS
    for wdt in ("float32", sixteen_bit_side(act, out))
    for mode, offset in ((AFTER, 0.0), (BEFORE, 1.0))
] + [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, NONE), out) for act, out in MIXED_PAIRS]


@pytest.mark.parametrize("spec", MIXED_SPECS, ids=repr)
def test_mixed_precision_every_pair_and_mode(spec: RmsNormSpec) -> None:
    for rows in (*ROWS, 4097):
        run_rms(spec, rows)


@pytest.mark.parametrize("hidden", [*HIDDENS, 1004, 1001])
@pytest.mark.parametrize(("dtype", "out_dtype"), [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_mixed_precision_every_hidden_size(hidden: int, dtype: str, out_dtype: str) -> None:
    spec = RmsNormSpec(hidden, dtype, sixteen_bit_side(dtype, out_dtype), NormParams(1e-6, 0.0, AFTER), out_dtype)
    for rows in ROWS:
        run_rms(spec, rows)


@pytest.mark.parametrize("misalign", [1, 2])
@pytest.mark.parametrize(("dtype", "out_dtype"), [("float32", "float16"), ("float16", "float32")])
def test_mixed_precision_unaligned_pointers(misalign: int, dtype: str, out_dtype: str) -> None:
    spec = RmsNormSpec(4096, dtype, "float32", NormParams(1e-6, 0.0, AFTER), out_dtype)
    for rows in ROWS:
        run_rms(spec, rows, misalign)


@pytest.mark.parametrize(
    "spec",
    [
        QkNormSpec(128, 128, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16"),
        QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, BEFORE), "float32"),
        QkNormSpec(4096, 1024, "float16", "float32", NormParams(1e-6, 0.0, AFTER), "float32"),
    ],
    ids=repr,
)
def test_mixed_precision_qk_norm(spec: QkNormSpec) -> None:
    heads = (32, 8) if spec.q_hidden <= 256 else (1, 1)
    for tokens in ROWS:
        run_qk(spec, tokens, *heads)


def test_mixed_precision_decode_replays_from_a_cuda_graph() -> None:
    spec = RmsNormSpec(4096, "float32", "bfloat16", NormParams(7e-6, 0.0, AFTER), "bfloat16")
    kernel = get_rms_norm(spec)
    kernel.warm_up(max_rows=32)
    x, w = rand((32, 4096), "float32"), rand((4096,), "bfloat16")
    out = poisoned((32, 4096), "bfloat16")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        kernel.launch(x.data_ptr(), w.data_ptr(), out.data_ptr(), 32, torch.cuda.current_stream().cuda_stream)
    for _ in range(2):
        x.copy_(rand((32, 4096), "float32"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, norm_reference(x, w, NormParams(7e-6, 0.0, AFTER), "bfloat16"))
