"""GPU: the QK-norm + rotary kernel against the float64 reference (trtfuse.bench.reference.qk_norm_rope_reference)
on fresh random q and k and the cos/sin tables of real positions (rope theta 1e6 and 10000, positions up to 32k and
past 100k), every output written over two poisons (NaN, then a finite value: both runs must give the same bits).

Shapes: Qwen3-like (32 q heads, 8 kv heads, D 128), odd head counts (7 and 3), Gemma3's head-major rows (D 256,
an fp32 weight, offset 1), OLMo2's full-width norm (4096 and 1024 wide, rotated per 128-wide head), partial rotary,
interleaved pairs, mixed x/y dtypes, no weight; 1, 7, 300 and 4096 tokens split into batch and sequence, cos/sin
of one batch row (Bc 1) and of every batch (Bc B); aligned (16-byte vectors and shuffles) and each pointer one
element off (the element path). The quantized outputs are bit for bit Q(out) of the plain kernel's out."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from trtfuse.bench.aot.matrix import rope_params as rope
from trtfuse.contract import NormParams, Quantizer, QuantParams, WeightMode
from trtfuse.contract.rotary_shapes import attention_dims
from trtfuse.kernels import QkNormRopeSpec, get_qk_norm_rope

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import (  # noqa: E402  (needs torch)
    QUANT_TORCH_DTYPES,
    qk_norm_rope_reference,
    quantize_reference,
    rotary_tables,
    rotated_tolerance,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
LLAMA = NormParams(1e-6, 0.0, AFTER)
GEMMA = NormParams(1e-6, 1.0, BEFORE)
OLMO = NormParams(1e-6, 0.0, BEFORE)
# (tokens, batch): 1 decode token, 7 sequences of one token, 3 prompts of 100, 2 prompts of 2048.
TOKENS = ((1, 1), (7, 7), (300, 3), (4096, 2))
# A finite second poison: an element the kernel leaves unwritten keeps one of the two, and the runs differ there.
SECOND_POISON = 1234.5
QUANT_POISONS = (0x7F, 0x00)


@pytest.fixture(autouse=True)
def fresh_seed() -> None:
    """A new random seed per test, printed so a failure can be replayed with torch.manual_seed."""
    print(f"torch seed {torch.seed()}")


def dt(name: str) -> torch.dtype:
    return QUANT_TORCH_DTYPES.get(name) or getattr(torch, name)


def rand(shape: tuple[int, ...], dtype: str, offset: int = 0) -> torch.Tensor:
    """Fresh random values (rows of random magnitudes), `offset` elements past an aligned allocation."""
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    x *= torch.rand((*shape[:-1], 1), device="cuda") * 4 + 0.1
    buffer = torch.empty(offset + x.numel(), device="cuda", dtype=dt(dtype))
    view = buffer[offset:].view(shape)
    view.copy_(x)
    return view


def placed(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `t` starting `offset` elements past an aligned allocation."""
    buffer = torch.empty(offset + t.numel(), device=t.device, dtype=t.dtype)
    view = buffer[offset:].view(t.shape)
    view.copy_(t)
    return view


def empty(shape: tuple[int, ...], dtype: str, offset: int = 0) -> torch.Tensor:
    return torch.empty(offset + int(torch.tensor(shape).prod()), device="cuda", dtype=dt(dtype))[offset:].view(shape)


def poison(t: torch.Tensor, second: bool) -> None:
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(QUANT_POISONS[second])
    else:
        t.fill_(SECOND_POISON if second else float("nan"))


def activation_shape(spec: QkNormRopeSpec, part: int, tokens: int, batch: int, heads: int) -> tuple[int, ...]:
    """[B, S, H, D] or [B, S, H·D] (a full-width norm) token-major, [B, H, S, D] head-major."""
    hidden = (spec.q_hidden, spec.k_hidden)[part]
    seq_len = tokens // batch
    if spec.rope.layout == "head_major":
        return (batch, heads, seq_len, hidden)
    if hidden > spec.rope.head_dim:
        return (batch, seq_len, hidden)
    return (batch, seq_len, heads, hidden)


def output_shape(spec: QkNormRopeSpec, part: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of part `part`'s output for an activation of `shape`: its own, or its [B, H, S, D]."""
    hidden = (spec.q_hidden, spec.k_hidden)[part]
    return tuple(attention_dims(shape, hidden, spec.rope.head_dim)) if spec.rope.moves_heads else tuple(shape)


def tables(spec: QkNormRopeSpec, batch: int, seq_len: int, per_batch: bool, theta: float, start: int):
    """cos, sin [Bc, S, R] of positions start.. (each batch row its own random offset when per_batch)."""
    cos_batch = batch if per_batch else 1
    offsets = torch.randint(0, max(1, start), (cos_batch, 1), device="cuda") if per_batch else start
    positions = torch.arange(seq_len, device="cuda")[None, :] + offsets
    return rotary_tables(positions, spec.rope.rotary_dim, theta, spec.rope.rotation, dt(spec.cos_dtype))


def run(spec, tokens, batch, heads, per_batch, theta=1e6, start=0, offsets=(0,) * 6, graph=False):
    """Launch `spec` twice over two poisons on fresh inputs; returns (q, k, wq, wk, cos, sin, outputs). `offsets`
    shift q, k, cos, sin, q_out, k_out by that many elements."""
    seq_len = tokens // batch
    shapes = [activation_shape(spec, part, tokens, batch, h) for part, h in enumerate(heads)]
    q, k = (rand(shape, spec.dtype, offset) for shape, offset in zip(shapes, offsets[:2], strict=True))
    wq = wk = None
    if spec.weight_dtype is not None:
        wq, wk = (rand((hidden,), spec.weight_dtype) for hidden in (spec.q_hidden, spec.k_hidden))
    cos, sin = (
        placed(t, o) for t, o in zip(tables(spec, batch, seq_len, per_batch, theta, start), offsets[2:4], strict=True)
    )
    outs = [
        empty(output_shape(spec, part, shape), spec.part_y_dtype(part), o)
        for part, (shape, o) in enumerate(zip(shapes, offsets[4:], strict=True))
    ]
    kernel = get_qk_norm_rope(spec)
    results = []
    for second in (False, True):
        for out in outs:
            poison(out, second)
        if graph:
            kernel.warm_up(max_rows=q.numel() // spec.q_hidden)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured, stream=torch.cuda.Stream()):
                kernel(q, k, cos, sin, wq, wk, *outs)
            captured.replay()
        else:
            kernel(q, k, cos, sin, wq, wk, *outs)
        torch.cuda.synchronize()
        results.append([out.clone() for out in outs])
    for first, again in zip(*results, strict=True):
        same = first.view(torch.uint8) == again.view(torch.uint8)
        assert bool(same.all()), f"{int((~same).sum())} bytes differ between the two poisons (unwritten elements)"
    return q, k, wq, wk, cos, sin, results[0]


def check(spec, tokens, batch, heads, per_batch, **kwargs) -> None:
    q, k, wq, wk, cos, sin, outs = run(spec, tokens, batch, heads, per_batch, **kwargs)
    for part, (x, w, out) in enumerate(zip((q, k), (wq, wk), outs, strict=True)):
        reference, magnitude = qk_norm_rope_reference(x, w, cos, sin, spec, part, batch, tokens // batch)
        what = f"{'qk'[part]}_out tokens={tokens} batch={batch} Bc={'B' if per_batch else 1}"
        assert not torch.isnan(out).any(), f"{what}: NaN"
        error = (out.double() - reference.double()).abs()
        allowed = rotated_tolerance(spec, reference, magnitude)
        bad = error > allowed
        if bool(bad.any()):
            at = int((error / allowed).argmax())
            got, expected = float(out.reshape(-1)[at]), float(reference.reshape(-1)[at])
            pytest.fail(f"{what}: {int(bad.sum())} elements off; worst at {at}: {got!r} for {expected!r}")


# Token-major rows written in the attention's [B, H, S, D] (the node that takes ModelOpt FP8's Q after the rotation).
HEAD_MAJOR_OUT = "head_major"


# (name, spec, (q heads, k heads), rope theta)
CASES = [
    ("qwen3", QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", LLAMA, rope=rope(128)), (32, 8), 1e6),
    (
        "qwen3-fp32-tables",
        QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", LLAMA, rope=rope(128), cos_dtype="float32"),
        (32, 8),
        1e6,
    ),
    (
        "gemma3-head-major-odd-heads",
        QkNormRopeSpec(
            256, 256, "bfloat16", "float32", GEMMA, rope=rope(256, layout="head_major"), cos_dtype="float32"
        ),
        (7, 3),
        1e4,
    ),
    ("olmo2-full-width", QkNormRopeSpec(4096, 1024, "bfloat16", "bfloat16", OLMO, rope=rope(128)), (1, 1), 5e5),
    ("partial-fp16", QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=rope(128, 64)), (7, 3), 1e4),
    (
        "interleaved-fp32",
        QkNormRopeSpec(64, 64, "float32", "float32", GEMMA, rope=rope(64, None, "interleaved")),
        (5, 5),
        1e4,
    ),
    (
        "interleaved-partial-head-major",
        QkNormRopeSpec(128, 128, "float16", "float32", LLAMA, rope=rope(128, 32, "interleaved", "head_major")),
        (4, 2),
        1e4,
    ),
    ("fp32-to-bf16", QkNormRopeSpec(128, 128, "float32", "bfloat16", LLAMA, "bfloat16", rope=rope(128)), (32, 8), 1e6),
    ("bf16-to-fp32", QkNormRopeSpec(128, 128, "bfloat16", "float32", GEMMA, "float32", rope=rope(128)), (16, 4), 1e6),
    (
        "fp32-head256-no-weight",
        QkNormRopeSpec(256, 256, "float32", None, NormParams(1e-5, 0.0, NONE), rope=rope(256, 128)),
        (3, 1),
        1e4,
    ),
    ("odd-half-rotary", QkNormRopeSpec(64, 64, "bfloat16", "bfloat16", LLAMA, rope=rope(64, 6)), (3, 3), 1e4),
    (
        "qwen3-writes-head-major",
        QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=rope(128, output_layout=HEAD_MAJOR_OUT)),
        (32, 8),
        1e6,
    ),
    (
        "olmo2-full-width-writes-head-major",
        QkNormRopeSpec(4096, 1024, "bfloat16", "bfloat16", OLMO, rope=rope(128, output_layout=HEAD_MAJOR_OUT)),
        (1, 1),
        5e5,
    ),
    (
        # fp32 y of a 16-bit x: the tiling's paired stores, which a row of heads S·D apart does without.
        "olmo2-bf16-to-fp32-writes-head-major",
        QkNormRopeSpec(
            2048, 512, "bfloat16", "float32", OLMO, "float32", rope=rope(128, 64, output_layout=HEAD_MAJOR_OUT)
        ),
        (1, 1),
        1e4,
    ),
    (
        "interleaved-odd-heads-writes-head-major",
        QkNormRopeSpec(
            64,
            64,
            "float32",
            "bfloat16",
            GEMMA,
            "bfloat16",
            rope=rope(64, 32, "interleaved", output_layout=HEAD_MAJOR_OUT),
        ),
        (5, 3),
        1e4,
    ),
]


@pytest.mark.parametrize(("name", "spec", "heads", "theta"), CASES, ids=[c[0] for c in CASES])
def test_matches_the_float64_reference(name: str, spec: QkNormRopeSpec, heads: tuple[int, int], theta: float) -> None:
    for (tokens, batch), per_batch in zip(TOKENS, (False, True, False, True), strict=True):
        check(spec, tokens, batch, heads, per_batch, theta=theta, start=32768 - tokens // batch)
        check(spec, tokens, batch, heads, not per_batch, theta=theta)


def test_long_positions() -> None:
    """Positions past 100k (128k-context models): the angles are large, the tables still just inputs."""
    spec = CASES[0][1]
    check(spec, 300, 3, (32, 8), True, start=131072 - 100)
    check(spec, 4096, 1, (32, 8), False, start=200_000)


@pytest.mark.parametrize("name", ["q", "k", "cos", "sin", "q_out", "k_out", "all"])
def test_each_pointer_off_alignment_takes_the_element_path(name: str) -> None:
    names = ("q", "k", "cos", "sin", "q_out", "k_out")
    offsets = tuple(int(name in (n, "all")) for n in names)
    writes_head_major = [(case[1], case[2]) for case in CASES if case[0].endswith("writes-head-major")]
    for spec, heads in ((CASES[0][1], (32, 8)), (CASES[2][1], (7, 3)), (CASES[3][1], (1, 1)), *writes_head_major):
        for tokens, batch in TOKENS[:3]:
            check(spec, tokens, batch, heads, True, offsets=offsets)


def test_zero_tokens_write_nothing() -> None:
    """A 0-token launch (one block, every row past the end) leaves the outputs' poison as it is."""
    kernel = get_qk_norm_rope(CASES[0][1])
    outs = [torch.full((1, 1, heads, 128), float("nan"), device="cuda", dtype=torch.bfloat16) for heads in (32, 8)]
    inputs = [torch.ones_like(out) for out in outs]
    cos = sin = torch.ones((1, 1, 128), device="cuda", dtype=torch.bfloat16)
    weights = [torch.ones(128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    pointers = [t.data_ptr() for t in (*inputs, *weights, cos, sin, *outs)]
    kernel.launch(*pointers, 0, 0, 0, 1, 1, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert all(bool(out.isnan().all()) for out in outs)


def test_raw_pointer_launch_replays_from_a_cuda_graph() -> None:
    check(CASES[0][1], 7, 7, (32, 8), True, graph=True)


# FP8 q (ModelOpt's attention inputs), INT8 k of its own scale; saturating and not.
QUANTS = (
    QuantParams(q_output=Quantizer("float8_e4m3fn", 0.015625), k_output=Quantizer("int8", 0.03125)),
    QuantParams(q_output=Quantizer("float8_e4m3fn", 0.25, saturate=False)),
)


def plain_in_the_same_tilings(spec: QkNormRopeSpec, tensors: tuple, batch: int, seq_len: int) -> list[torch.Tensor]:
    """The plain kernel's (q_out, k_out) in T on the quantized run's own inputs, in the tilings the quantized `spec`
    runs (a quantized output's tiling may differ, and with it the order of the sum of squares), launched as the
    plugins launch (raw pointers)."""
    from trtfuse.kernels.api import QkNormRopeKernel, shared_cache
    from trtfuse.kernels.compiler import QkNormRopeVariant

    q, k, wq, wk, cos, sin = tensors
    kernel = get_qk_norm_rope(spec)
    variant = QkNormRopeKernel.variant_for(spec, kernel.device.arch)
    plain = dataclasses.replace(spec, quant=None)
    function = shared_cache().get(QkNormRopeVariant(plain, variant.q_tiling, variant.k_tiling, kernel.device.arch))
    outs = [
        torch.empty(output_shape(spec, part, tuple(t.shape)), device="cuda", dtype=getattr(torch, spec.out_dtype))
        for part, t in enumerate((q, k))
    ]
    weights = [0 if w is None else w.data_ptr() for w in (wq, wk)]
    pointers = [q.data_ptr(), k.data_ptr(), *weights, cos.data_ptr(), sin.data_ptr(), *(o.data_ptr() for o in outs)]
    rows = (q.numel() // spec.q_hidden, k.numel() // spec.k_hidden)
    function(*pointers, *rows, batch, seq_len, cos.shape[0], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("quant", QUANTS, ids=["fp8-q-int8-k", "fp8-q-unsaturated"])
@pytest.mark.parametrize(
    "name",
    [
        "qwen3",
        "gemma3-head-major-odd-heads",
        "olmo2-full-width",
        "qwen3-writes-head-major",
        "olmo2-full-width-writes-head-major",
    ],
)
def test_quantized_outputs_are_the_plain_kernels_out_through_their_quantizers(name: str, quant: QuantParams) -> None:
    """Each quantized output is, bit for bit, its quantizer of the plain kernel's out in the same tilings (where
    the tilings differ, so may the order of a row's sum of squares, and a code then flip at a rounding boundary)."""
    _, plain_spec, heads, theta = next(case for case in CASES if case[0] == name)
    spec = dataclasses.replace(plain_spec, quant=quant)
    for (tokens, batch), offset in zip(TOKENS[:3], (0, 1, 0), strict=True):
        offsets = (offset,) * 6
        torch.manual_seed(tokens)
        *tensors, outs = run(spec, tokens, batch, heads, True, theta=theta, offsets=offsets)
        plain = plain_in_the_same_tilings(spec, tuple(tensors), batch, tokens // batch)
        for part, (out, y) in enumerate(zip(outs, plain, strict=True)):
            expected = y if spec.part_quant(part) is None else quantize_reference(y, spec.part_quant(part).output)
            same = out.view(torch.uint8) == expected.view(torch.uint8)
            assert bool(same.all()), f"{'qk'[part]}_out tokens={tokens}: {int((~same).sum())} codes differ"


@pytest.mark.parametrize("output_layout", [None, HEAD_MAJOR_OUT], ids=["token-major", "writes-head-major"])
@pytest.mark.parametrize("q_output", [None, Quantizer("int8", 0.029388427734375)], ids=["products", "with-q-output"])
def test_modelopt_product_stages_are_the_graphs_rounding_of_the_kernels_own_y(
    q_output: Quantizer | None, output_layout: str | None
) -> None:
    """ModelOpt's FP8 Qwen3 rotation (float16, every product through an FP8 pair): each output is, bit for bit,
    `quantized_products_reference` of the kernel's own y rounded to T (the plain kernel in the same tilings with
    cos 1 and sin 0 writes exactly that), then q's output quantizer; aligned and one element off."""
    from trtfuse.bench.aot.matrix import MODELOPT_FP8_PRODUCTS
    from trtfuse.bench.reference import quantized_products_reference

    plain_spec = QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=rope(128, output_layout=output_layout))
    spec = dataclasses.replace(plain_spec, quant=dataclasses.replace(MODELOPT_FP8_PRODUCTS, q_output=q_output))
    # The outputs' layout, as the reference reads them (y_t below is written in it too).
    written = dataclasses.replace(spec.rope, layout=spec.rope.output_layout)
    for (tokens, batch), offset in zip(TOKENS[:3], (0, 1, 0), strict=True):
        torch.manual_seed(tokens)
        q, k, wq, wk, cos, sin, outs = run(spec, tokens, batch, (32, 8), True, offsets=(offset,) * 6)
        unrotated = (torch.ones_like(cos), torch.zeros_like(sin))
        y_t = plain_in_the_same_tilings(spec, (q, k, wq, wk, *unrotated), batch, tokens // batch)
        for part, (out, y) in enumerate(zip(outs, y_t, strict=True)):
            quant = spec.part_quant(part)
            expected = quantized_products_reference(y, cos, sin, written, quant, batch, tokens // batch)
            if quant.output is not None:
                expected = quantize_reference(expected, quant.output)
            same = out.view(torch.uint8) == expected.view(torch.uint8)
            assert bool(same.all()), f"{'qk'[part]}_out tokens={tokens}: {int((~same).sum())} values differ"
