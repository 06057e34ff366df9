"""GPU: the QK-norm + rotary kernel with its norms' own quantizer stages (ModelOpt's INT8 rotations), bit for bit.

Gemma3's INT8 export puts a pair on each q/k norm's output before the rotation (the normalised stage), OLMo2's a pair
on each norm's input and inverse root (the input and rsqrt stages), both a pair on each product of the rotation and
Gemma3 a Q on q's result. Each output is, bit for bit, the contract's arithmetic from the kernel's own y rounded to T
(the kernel in the same tilings with cos 1 and sin 0, the norm's stages kept, writes exactly that; its float32 y may
differ from the float64 reference's in the last bit, which a quantizer may turn into a step): the normalised stage's
DQ(Q(·)) of it, then `quantized_products_reference`, then q's output quantizer. Aligned and one element off (the
element path), decode and prefill token counts, cos/sin of one batch row and of every batch row."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from trtfuse.bench.aot.matrix import MODELOPT_INT8_GEMMA3, MODELOPT_INT8_OLMO2, rope_entries
from trtfuse.contract import NormParams, QuantParams, QuantStage, WeightMode
from trtfuse.kernels import QkNormRopeSpec, get_qk_norm_rope

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import (  # noqa: E402  (needs torch)
    QUANT_TORCH_DTYPES,
    fake_quant_reference,
    quantize_reference,
    quantized_products_reference,
    rotary_tables,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

LLAMA = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
# The stages inside the norm, before its y: what the kernel's own y is computed with.
NORM_STAGES = (QuantStage.INPUT, QuantStage.RSQRT)
# (tokens, batch, cos/sin per batch row): a decode token, 7 sequences of one token, 3 prompts of 100.
TOKENS = ((1, 1, False), (7, 7, True), (300, 3, False))
# (spec, (q heads, k heads)): the AOT matrix's entries, Gemma3's head-major rows of 64 (odd head counts) and OLMo2's
# full-width norm.
CASES = {
    name: next((entry.spec, entry.heads) for entry in rope_entries() if entry.spec.quant == quant)
    for name, quant in (("gemma3-int8", MODELOPT_INT8_GEMMA3), ("olmo2-int8", MODELOPT_INT8_OLMO2))
}


@pytest.fixture(autouse=True)
def fresh_seed() -> None:
    """A new random seed per test, printed so a failure can be replayed with torch.manual_seed."""
    print(f"torch seed {torch.seed()}")


def placed(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `t` starting `offset` elements past an aligned allocation."""
    buffer = torch.empty(offset + t.numel(), device=t.device, dtype=t.dtype)
    view = buffer[offset:].view(t.shape)
    view.copy_(t)
    return view


def activation(spec: QkNormRopeSpec, part: int, tokens: int, batch: int, heads: int, offset: int) -> torch.Tensor:
    """Random rows of random magnitudes, [B, H, S, D] head-major, [B, S, H·D] for a full-width norm."""
    hidden = (spec.q_hidden, spec.k_hidden)[part]
    seq_len = tokens // batch
    shape = (batch, heads, seq_len, hidden) if spec.rope.layout == "head_major" else (batch, seq_len, hidden)
    x = torch.randn(shape, device="cuda") * (torch.rand((*shape[:-1], 1), device="cuda") * 4 + 0.1)
    return placed(x.to(getattr(torch, spec.dtype)), offset)


def outputs(spec: QkNormRopeSpec, tensors: tuple, offset: int) -> list[torch.Tensor]:
    """Each part's output, written over a poison, by the kernel of `spec` in the tilings `spec` itself runs."""
    q, k, wq, wk, cos, sin = tensors
    outs = []
    for part, x in enumerate((q, k)):
        dtype = QUANT_TORCH_DTYPES.get(spec.part_y_dtype(part)) or getattr(torch, spec.part_y_dtype(part))
        out = placed(torch.empty(x.shape, device="cuda", dtype=dtype), offset)
        out.view(torch.uint8).fill_(0x7F)
        outs.append(out)
    get_qk_norm_rope(spec)(q, k, cos, sin, wq, wk, *outs)
    torch.cuda.synchronize()
    return outs


def own_y_in_the_same_tilings(spec: QkNormRopeSpec, tensors: tuple, batch: int, seq_len: int) -> list[torch.Tensor]:
    """The kernel's own y rounded to T (q's and k's), its input and rsqrt stages applied: the kernel with those
    stages alone and cos 1, sin 0 (each rotated element fl(fl(y·1) + fl(y'·0)) = y, rounded once), in the tilings
    the full `spec` runs (another tiling may sum a row's squares in another order), launched as the plugins launch."""
    from trtfuse.kernels.api import QkNormRopeKernel, shared_cache
    from trtfuse.kernels.compiler import QkNormRopeVariant

    q, k, wq, wk, cos, sin = tensors
    kept = {stage.value: spec.quant.at(stage) for stage in spec.quant.stages if stage.norm_stage in NORM_STAGES}
    own = dataclasses.replace(spec, quant=QuantParams(**kept) if kept else None)
    kernel = get_qk_norm_rope(spec)
    variant = QkNormRopeKernel.variant_for(spec, kernel.device.arch)
    function = shared_cache().get(QkNormRopeVariant(own, variant.q_tiling, variant.k_tiling, kernel.device.arch))
    outs = [torch.empty(tuple(t.shape), device="cuda", dtype=getattr(torch, spec.out_dtype)) for t in (q, k)]
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)
    pointers = [q.data_ptr(), k.data_ptr(), wq.data_ptr(), wk.data_ptr(), ones.data_ptr(), zeros.data_ptr()]
    rows = (q.numel() // spec.q_hidden, k.numel() // spec.k_hidden)
    stream = torch.cuda.current_stream().cuda_stream
    function(*pointers, *(o.data_ptr() for o in outs), *rows, batch, seq_len, cos.shape[0], stream)
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("name", sorted(CASES))
def test_modelopt_int8_norm_stages_are_the_graphs_rounding_of_the_kernels_own_y(name: str) -> None:
    spec, heads = CASES[name]
    for (tokens, batch, per_batch), offset in zip(TOKENS, (0, 1, 0), strict=True):
        torch.manual_seed(tokens)
        seq_len = tokens // batch
        q, k = (activation(spec, part, tokens, batch, h, offset) for part, h in enumerate(heads))
        wq, wk = (
            torch.rand(hidden, device="cuda").to(torch.float16) + 0.5 for hidden in (spec.q_hidden, spec.k_hidden)
        )
        positions = torch.arange(seq_len, device="cuda")[None, :] + (
            torch.randint(0, 4096, (batch, 1), device="cuda") if per_batch else 0
        )
        tables = rotary_tables(positions, spec.rope.rotary_dim, 1e4, "half", torch.float16)
        cos, sin = (placed(t, offset) for t in tables)
        tensors = (q, k, wq, wk, cos, sin)
        outs = outputs(spec, tensors, offset)
        for part, (out, y) in enumerate(
            zip(outs, own_y_in_the_same_tilings(spec, tensors, batch, seq_len), strict=True)
        ):
            quant = spec.part_quant(part)
            if quant.normalised is not None:
                y = fake_quant_reference(y, quant.normalised)
            expected = quantized_products_reference(y, cos, sin, spec.rope, quant, batch, seq_len)
            if quant.output is not None:
                expected = quantize_reference(expected, quant.output)
            same = out.view(torch.uint8) == expected.reshape(out.shape).view(torch.uint8)
            assert bool(same.all()), f"{'qk'[part]}_out tokens={tokens}: {int((~same).sum())} values differ"
