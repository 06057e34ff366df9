"""CPU/CI: the rotary kernel's host-side pieces that need no GPU: the register exchange plan (which slot of which
lane holds each rotated vector's partner), the vector a rotated row takes, the spec's validation, the launch
declaration's extents, and the float64 reference against an independent rotate_half / GPT-J formulation."""

from __future__ import annotations

import itertools
import json

import pytest

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.declaration import (
    ROPE_EXTENTS,
    TOKEN_SHIFT,
    LaunchDeclaration,
    RowPart,
    Tactic,
    qk_norm_rope_params,
)
from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams
from trtfuse.kernels.tiling import Regime, RotationPlan, RowTiling, rotation_plan, rotation_vector, row_tiling

LLAMA = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)


def partner_of(vector_index: int, plan: RotationPlan, rotation: str) -> int | None:
    """The row vector holding `vector_index`'s partner values, by the rotation's definition; None if not rotated."""
    position = vector_index % plan.head_vectors
    if position >= plan.rotary_vectors:
        return None
    if rotation == "interleaved":
        return vector_index
    half = plan.rotary_vectors // 2
    return vector_index + (half if position < half else -half)


def exchanged(lane: int, slot: int, plan: RotationPlan, tiling: RowTiling) -> int:
    """The row vector the kernel's exchange reads for (lane, slot): slot `source_slots[slot]` of the lane the
    kernel's shift formula names (`norm_kernel._store_rotated`: ±half vectors, less the slots between)."""
    source = plan.source_slots[slot]
    if not plan.shuffles[slot]:
        return lane + source * tiling.threads_per_row
    position = (lane + slot * tiling.threads_per_row) % plan.head_vectors
    half = plan.rotary_vectors // 2
    shift = (half if position < half else -half) + (slot - source) * tiling.threads_per_row
    return lane + shift + source * tiling.threads_per_row


TILINGS = [
    # (hidden, head_dim, rotary_dim, rotation, element bytes of x, of y)
    (hidden, head, rotary, rotation, x_bytes, y_bytes)
    for head in (64, 96, 128, 256)
    for hidden in (head, head * 8, head * 32)
    for rotary in sorted({head, head // 2, 32, 6, head - 32})
    for rotation in ("half", "interleaved")
    for x_bytes, y_bytes in ((2, 2), (4, 4), (2, 4), (4, 2), (2, 1))
    if rotary % 2 == 0 and 0 < rotary <= head
]


@pytest.mark.parametrize(("hidden", "head", "rotary", "rotation", "x_bytes", "y_bytes"), TILINGS)
def test_the_exchange_reads_every_rotated_vectors_partner(
    hidden: int, head: int, rotary: int, rotation: str, x_bytes: int, y_bytes: int
) -> None:
    """For the tiling each (aligned or scalar) vector gives: either no plan (the element path) or one whose shuffle
    (or register read) hands every rotated vector of every lane exactly its partner, from a lane of its own warp."""
    for vector in (16 // min(x_bytes, y_bytes), 1):
        vector = rotation_vector(vector, head, rotary, rotation)
        span = rotary // 2 if rotation == "half" else rotary
        assert head % vector == 0 and span % vector == 0
        tiling = row_tiling(hidden, vector, Regime.PREFILL, x_bytes, y_bytes)
        plan = rotation_plan(tiling, head, rotary, rotation)
        if plan is None:
            assert vector == 1 or tiling.vectors_per_thread > 1, "16-byte head rows of one slot always exchange"
            continue
        threads = tiling.threads_per_row
        for lane, slot in itertools.product(range(threads), range(tiling.vectors_per_thread)):
            vector_index = lane + slot * threads
            if vector_index >= tiling.vectors_per_row:
                continue
            partner = partner_of(vector_index, plan, rotation)
            if partner is None:
                continue
            got = exchanged(lane, slot, plan, tiling)
            assert got == partner, (lane, slot, plan)
            assert got % threads // 32 == lane // 32, "a shuffle stays inside its warp"


def test_qwen3_heads_exchange_by_one_shuffle_per_element_and_fp32_gemma_heads_by_registers() -> None:
    bf16 = row_tiling(128, 8, Regime.PREFILL, 2, 2)
    plan = rotation_plan(bf16, 128, 128, "half")
    assert (bf16.threads_per_row, bf16.vectors_per_thread) == (16, 1)
    assert plan == RotationPlan(16, 16, (0,), (True,))
    fp32 = row_tiling(256, 4, Regime.PREFILL, 4, 4)
    assert (fp32.threads_per_row, fp32.vectors_per_thread) == (32, 2)
    # Slot 0 holds the first half of the head, slot 1 the second: each partner is the lane's other slot.
    assert rotation_plan(fp32, 256, 256, "half") == RotationPlan(64, 64, (1, 0), (False, False))
    assert rotation_plan(bf16, 128, 128, "interleaved") == RotationPlan(16, 16, (0,), (False,))


def test_a_vector_shrinks_to_divide_the_rotated_width() -> None:
    assert rotation_vector(8, 128, 128, "half") == 8
    assert rotation_vector(8, 128, 8, "half") == 4  # R/2 = 4: a partner 4 elements away is a whole 4-vector
    assert rotation_vector(8, 64, 6, "half") == 1
    assert rotation_vector(8, 64, 6, "interleaved") == 2
    assert rotation_vector(16, 80, 80, "half") == 8


def test_rotation_params_and_spec_validation() -> None:
    head = RopeParams(128, 128, "half", "token_major")
    with pytest.raises(ValueError, match="rotary_dim must be a positive even int"):
        RopeParams(128, 7, "half", "token_major")
    with pytest.raises(ValueError, match="wider than head_dim"):
        RopeParams(64, 128, "half", "token_major")
    with pytest.raises(ValueError, match="rotation 'neox'"):
        RopeParams(128, 128, "neox", "token_major")
    with pytest.raises(ValueError, match="layout"):
        RopeParams(128, 128, "half", "bshd")
    with pytest.raises(ValueError, match="neither float32 nor the activations' bfloat16"):
        QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", LLAMA, rope=head, cos_dtype="float16")
    with pytest.raises(ValueError, match="q_hidden 100 is not a whole number of heads"):
        QkNormRopeSpec(100, 128, "bfloat16", "bfloat16", LLAMA, rope=head)
    with pytest.raises(ValueError, match="a head-major k_hidden must be one head"):
        QkNormRopeSpec(128, 256, "bfloat16", "bfloat16", LLAMA, rope=RopeParams(128, 128, "half", "head_major"))
    spec = QkNormRopeSpec(4096, 1024, "float32", "float32", LLAMA, rope=head)
    assert spec.cos_dtype == "float32" and spec.norm().q_hidden == 4096 and type(spec.norm()).__name__ == "QkNormSpec"
    assert "rope=RopeParams(head_dim=128" in repr(spec) and "quant" not in repr(spec)


def test_the_declaration_passes_the_extents_after_the_row_counts() -> None:
    parts = (RowPart("q", 128, 8), RowPart("k", 128, 8))
    declaration = LaunchDeclaration(
        "tf0123456789a_0", "sm_90a", Tactic.PREFILL, 128, 64, qk_norm_rope_params(), parts, ROPE_EXTENTS
    )
    names = [p.name for p in declaration.params]
    inputs = ["q", "k", "q_weight", "k_weight", "cos", "sin"]
    scalars = ["q_rows", "k_rows", "batch", "seq_len", "cos_batch", "q_rows_per_token", "k_rows_per_token"]
    assert names == [*inputs, *scalars, "q_token_magic", "k_token_magic", "q_blocks", "q_out", "k_out"]
    assert [(e.tensor, e.axis) for e in declaration.extents] == [("q", 0), ("cos", 1), ("cos", 0)]
    # 3 sequences of one token: 32 q heads and 8 k heads a token, their multipliers 2^30 / 32 and / 8, 12 q blocks.
    assert declaration.scalars((96, 24), (3, 1, 3)) == (96, 24, 3, 1, 3, 32, 8, 1 << 25, 1 << 27, 12)
    # An empty call divides by nothing.
    assert declaration.scalars((0, 0), (0, 0, 1)) == (0, 0, 0, 0, 1, 0, 0, (1 << 30) - 1, (1 << 30) - 1, 0)
    assert declaration.grid_x((96, 24)) == 12 + 3
    with pytest.raises(ValueError, match="3 extents, got 0"):
        declaration.scalars((96, 24))
    assert LaunchDeclaration.from_json(json.loads(declaration.dumps())) == declaration


@pytest.mark.parametrize("heads", [1, 3, 7, 8, 28, 40, 64, 96, 255, 1000, 32767])
def test_the_token_multiplier_finds_every_rows_token_while_rows_times_heads_fit_2_to_the_30(heads: int) -> None:
    """The kernel's t = (row · m) >> 30 with the declaration's m, against row // H, at the largest launch that takes
    the multiply-shift (rows · H <= 2^30) and around every multiple of H near both ends."""
    parts = (RowPart("q", 128, 8), RowPart("k", 128, 8))
    declaration = LaunchDeclaration(
        "tf0123456789a_0", "sm_90a", Tactic.PREFILL, 128, 64, qk_norm_rope_params(), parts, ROPE_EXTENTS
    )
    rows = (1 << TOKEN_SHIFT) // heads
    tokens = rows // heads
    magic = declaration.scalars((tokens * heads, heads), (1, tokens, 1))[7]
    launch = tokens * heads
    for row in [*range(min(4 * heads, launch)), *range(max(0, launch - 4 * heads), launch)]:
        assert (row * magic) >> TOKEN_SHIFT == row // heads, row


def test_a_declaration_of_the_format_before_the_rows_per_token_is_refused() -> None:
    parts = (RowPart("q", 128, 8), RowPart("k", 128, 8))
    declaration = LaunchDeclaration(
        "tf0123456789a_0", "sm_90a", Tactic.PREFILL, 128, 64, qk_norm_rope_params(), parts, ROPE_EXTENTS
    )
    data = json.loads(declaration.dumps())
    data["format"] = 1
    with pytest.raises(ValueError, match="launch declaration format 1, expected 2"):
        LaunchDeclaration.from_json(data)


def test_a_declaration_without_extents_reads_back_from_json_written_before_them() -> None:
    parts = (RowPart("x", 4096, 1),)
    declaration = LaunchDeclaration("tf0123456789b_0", "sm_90a", Tactic.PREFILL, 256, 32, (), parts)
    data = json.loads(declaration.dumps())
    del data["extents"]
    assert LaunchDeclaration.from_json(data) == declaration


torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import qk_norm_rope_reference, rope_reference, rotary_tables  # noqa: E402


def hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotate_half, written independently of the reference."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def gptj_rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's rotate_every_two."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize(("rotation", "rotary"), [("half", 64), ("half", 32), ("interleaved", 64), ("interleaved", 16)])
@pytest.mark.parametrize("cos_batch", [1, 3])
def test_the_reference_rotates_as_hugging_face_and_gpt_j_do(
    layout: str, rotation: str, rotary: int, cos_batch: int
) -> None:
    batch, seq_len, heads, head_dim = 3, 5, 4, 64
    rope = RopeParams(head_dim, rotary, rotation, layout)
    generator = torch.Generator().manual_seed(7)
    positions = torch.randint(0, 40000, (cos_batch, seq_len), generator=generator)
    cos, sin = rotary_tables(positions, rotary, 1e6, rotation, torch.float64)
    shape = (batch, seq_len, heads, head_dim) if layout == "token_major" else (batch, heads, seq_len, head_dim)
    y = torch.randn(shape, generator=generator, dtype=torch.float64)
    out, magnitude = rope_reference(y, cos, sin, rope, batch, seq_len)
    c, s = (t[:, :, None, :] if layout == "token_major" else t[:, None, :, :] for t in (cos, sin))
    rotate = hf_rotate_half if rotation == "half" else gptj_rotate_every_two
    head = y[..., :rotary]
    torch.testing.assert_close(out[..., :rotary], head * c + rotate(head) * s, rtol=0, atol=1e-12)
    assert torch.equal(out[..., rotary:], y[..., rotary:])
    assert bool((magnitude >= out.abs() - 1e-12).all())
    # HF's tables: cos(p·θ^(-2i/R)) for i < R/2, then the same again (half) or each twice (interleaved).
    angle = positions[0, 1].double() * 1e6 ** (-2.0 / rotary)
    pair = (1, 1 + rotary // 2) if rotation == "half" else (2, 3)
    assert float(cos[0, 1, pair[0]]) == pytest.approx(float(angle.cos())) == float(cos[0, 1, pair[1]])


def test_the_reference_norms_before_it_rotates_and_rounds_once() -> None:
    """A full-width (OLMo2) part: the norm over H·D, the rotation per head of D, one rounding to T at the end."""
    olmo = NormParams(1e-6, 0.0, WeightMode.BEFORE_CAST)
    spec = QkNormRopeSpec(256, 128, "bfloat16", "bfloat16", olmo, rope=RopeParams(128, 128, "half", "token_major"))
    generator = torch.Generator().manual_seed(3)
    x = torch.randn((2, 3, 256), generator=generator).to(torch.bfloat16)
    w = torch.randn(256, generator=generator).to(torch.bfloat16)
    cos, sin = rotary_tables(torch.arange(3)[None, :], 128, 1e4, "half", torch.bfloat16)
    out, _ = qk_norm_rope_reference(x, w, cos, sin, spec, 0, 2, 3)
    x64 = x.double()
    y = x64 * (x64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w.double()
    heads = y.view(2, 3, 2, 128)
    rotated = heads * cos.double()[:, :, None] + hf_rotate_half(heads) * sin.double()[:, :, None]
    assert out.dtype == torch.bfloat16 and torch.equal(out, rotated.reshape(2, 3, 256).to(torch.bfloat16))
