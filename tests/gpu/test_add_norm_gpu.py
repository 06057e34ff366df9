"""GPU: the fused residual add+RMSNorm against float64 on fresh random inputs, outputs poisoned (run on the H200).

h must equal torch's `(x.float() + residual.float()).to(D)` bit for bit; y must match the float64 RMSNorm of that
rounded h within the RMSNorm kernels' tolerance.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES, NormParams, WeightMode, dtype_pair_problem
from trtfuse.kernels import AddRmsNormSpec, get_add_rms_norm

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import add_norm_reference  # noqa: E402  (needs torch)
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
PAIRS = [(d, t) for d, t in itertools.product(ACTIVATION_DTYPES, repeat=2) if dtype_pair_problem(d, t) is None]
ROWS = (1, 3, 133, 4097)  # one row, a few, just past the SM count (prefill), a last wave of one row


@pytest.fixture(autouse=True)
def fresh_seed() -> None:
    """A new random seed per test, printed so a failure can be replayed with torch.manual_seed."""
    print(f"torch seed {torch.seed()}")


def rand(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """Fresh random inputs (N(0, 1) scaled by a random per-row magnitude, so rows differ in size)."""
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    x *= torch.rand((*shape[:-1], 1), device="cuda") * 4 + 0.1
    return x.to(getattr(torch, dtype))


def poisoned(shape: tuple[int, ...], dtype: str, offset: int = 0) -> torch.Tensor:
    """NaN-filled output starting `offset` elements into its buffer (a pointer off 16-byte alignment)."""
    count = 1
    for n in shape:
        count *= n
    buf = torch.full((offset + count,), float("nan"), device="cuda", dtype=getattr(torch, dtype))
    return buf[offset:].view(shape)


def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `t` whose data pointer is `offset` elements past an aligned allocation."""
    if offset == 0:
        return t
    buf = torch.empty(offset + t.numel(), device=t.device, dtype=t.dtype)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


def rounded(spec: AddRmsNormSpec) -> str | None:
    """AFTER_CAST's 16-bit intermediate R (contract.rounding_dtype), else None."""
    if spec.params.weight_mode is not AFTER:
        return None
    return spec.dtype if spec.dtype != "float32" else spec.out_dtype


def assert_matches(y: torch.Tensor, ref: torch.Tensor, rounded_to: str | None = None) -> None:
    """The RMSNorm kernels' tolerance (tests/test_kernels_gpu.py): two units in the last place of y's dtype, or of
    AFTER_CAST's coarser R when it rounds there first."""
    assert not torch.isnan(y).any(), "y has unwritten (NaN-poisoned) or NaN elements"
    rtol, atol = max(
        KERNEL_ELEMENTWISE[str(y.dtype).removeprefix("torch.")], KERNEL_ELEMENTWISE[rounded_to or "float32"]
    )
    torch.testing.assert_close(y.double(), ref.double(), rtol=rtol, atol=atol)


def run_add(spec: AddRmsNormSpec, rows: int, misalign: int = 0) -> None:
    x = shifted(rand((rows, spec.hidden), spec.dtype), misalign)
    residual = shifted(rand((rows, spec.hidden), spec.dtype), misalign)
    w = None if spec.weight_dtype is None else shifted(rand((spec.hidden,), spec.weight_dtype), misalign)
    out = poisoned((rows, spec.hidden), spec.out_dtype, misalign)
    h_out = poisoned((rows, spec.hidden), spec.dtype, misalign)
    y, h = get_add_rms_norm(spec)(x, residual, w, out, h_out)
    torch.cuda.synchronize()
    assert y.data_ptr() == out.data_ptr() and h.data_ptr() == h_out.data_ptr()
    ref_y, ref_h = add_norm_reference(x, residual, w, spec.params, spec.out_dtype)
    assert not torch.isnan(h).any(), "h has unwritten (NaN-poisoned) elements"
    assert torch.equal(h, (x.float() + residual.float()).to(h.dtype)) and torch.equal(h, ref_h)
    assert_matches(y, ref_y, rounded(spec))


EVERY_PAIR_AND_WEIGHT = [
    AddRmsNormSpec(4096, d, w, NormParams(1e-6, offset, mode), t)
    for d, t in PAIRS
    for w in WEIGHT_DTYPES
    for mode, offset in ((AFTER, 0.0), (BEFORE, 1.0))
] + [AddRmsNormSpec(4096, d, None, NormParams(1e-5, 0.0, NONE), t) for d, t in PAIRS]


@pytest.mark.parametrize("spec", EVERY_PAIR_AND_WEIGHT, ids=repr)
def test_add_norm_every_dtype_pair_weight_and_mode(spec: AddRmsNormSpec) -> None:
    for rows in ROWS:
        run_add(spec, rows)


@pytest.mark.parametrize("hidden", [64, 128, 1000, 1001, 2048, 5120, 8192])
@pytest.mark.parametrize(
    ("dtype", "weight_dtype", "mode", "offset", "out_dtype"),
    [("bfloat16", "bfloat16", AFTER, 0.0, "bfloat16"), ("float32", "float16", AFTER, 0.0, "float16")],
)
def test_add_norm_every_hidden_size(
    hidden: int, dtype: str, weight_dtype: str, mode: WeightMode, offset: float, out_dtype: str
) -> None:
    spec = AddRmsNormSpec(hidden, dtype, weight_dtype, NormParams(1e-6, offset, mode), out_dtype)
    for rows in ROWS:
        run_add(spec, rows)


@pytest.mark.parametrize("misalign", [1, 2])
@pytest.mark.parametrize(
    "spec",
    [
        AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),
        AddRmsNormSpec(4096, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16"),
        AddRmsNormSpec(4096, "float16", "float32", NormParams(1e-6, 1.0, BEFORE), "float32"),
    ],
    ids=repr,
)
def test_add_norm_unaligned_pointers_take_the_element_variant(spec: AddRmsNormSpec, misalign: int) -> None:
    for rows in (1, 133):
        run_add(spec, rows, misalign)


def test_add_norm_one_pointer_off_alignment_at_a_time() -> None:
    """Each of x, residual, weight, y and h alone one element off: the element variant, still exact."""
    spec = AddRmsNormSpec(2048, "bfloat16", "float32", NormParams(1e-6, 0.0, AFTER))
    kernel = get_add_rms_norm(spec)
    rows = 7
    for which in range(5):
        offsets = [1 if i == which else 0 for i in range(5)]
        x = shifted(rand((rows, 2048), "bfloat16"), offsets[0])
        residual = shifted(rand((rows, 2048), "bfloat16"), offsets[1])
        w = shifted(rand((2048,), "float32"), offsets[2])
        y = poisoned((rows, 2048), "bfloat16", offsets[3])
        h = poisoned((rows, 2048), "bfloat16", offsets[4])
        kernel(x, residual, w, y, h)
        torch.cuda.synchronize()
        ref_y, ref_h = add_norm_reference(x, residual, w, spec.params)
        assert torch.equal(h, ref_h)
        assert_matches(y, ref_y, rounded(spec))


def test_add_norm_zero_rows_is_a_no_op() -> None:
    spec = AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    x = rand((0, 4096), "bfloat16")
    y, h = get_add_rms_norm(spec)(x, rand((0, 4096), "bfloat16"), rand((4096,), "bfloat16"))
    torch.cuda.synchronize()
    assert y.shape == h.shape == (0, 4096)


def test_add_norm_many_rows() -> None:
    """A long prefill whose last rows start past 2^31 bytes into each tensor (the kernel's 64-bit row offsets)."""
    spec = AddRmsNormSpec(8192, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    run_add(spec, 131_111)


def test_add_norm_raw_pointer_launch_replays_from_a_cuda_graph() -> None:
    """A plugin's path: warm up, then launch on raw pointers inside a capture on a side stream; replay on new
    inputs. The spec (its epsilon) is used by no other test, so the capture is the first launch after warm-up."""
    spec = AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, AFTER))
    kernel = get_add_rms_norm(spec)
    kernel.warm_up(max_rows=4096)
    rows = 32
    x, residual, w = rand((rows, 4096), "bfloat16"), rand((rows, 4096), "bfloat16"), rand((4096,), "bfloat16")
    y, h = poisoned((rows, 4096), "bfloat16"), poisoned((rows, 4096), "bfloat16")
    pointers = (x.data_ptr(), residual.data_ptr(), w.data_ptr(), y.data_ptr(), h.data_ptr())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        kernel.launch(*pointers, rows, torch.cuda.current_stream().cuda_stream)
    for _ in range(2):
        x.copy_(rand((rows, 4096), "bfloat16"))
        residual.copy_(rand((rows, 4096), "bfloat16"))
        y.fill_(float("nan"))
        h.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_y, ref_h = add_norm_reference(x, residual, w, spec.params)
        assert torch.equal(h, ref_h)
        assert_matches(y, ref_y, rounded(spec))
