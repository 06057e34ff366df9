"""PTX the CuTeDSL copy atoms do not expose: 16-byte global loads with an L2 cache-eviction policy.

`CopyG2ROp` sets L1 eviction priorities but not L2's; a `createpolicy` register plus `.L2::cache_hint` on the load
does (PTX ISA: "createpolicy", "ld"). The loads keep their program order (the asm has side effects), so a load
written after a barrier stays after it.
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, vector
from cutlass.cutlass_dsl import T, dsl_user_op


def _asm(
    result: ir.Type, operands: list[ir.Value], text: str, constraints: str, ordered: bool, loc: object, ip: object
) -> ir.Value:
    return llvm.inline_asm(
        result,
        operands,
        text,
        constraints,
        has_side_effects=ordered,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def l2_evict_policy(evict_last: bool, *, loc: ir.Location | None = None, ip: ir.InsertionPoint | None = None) -> Int64:
    """A cache policy covering every line it is applied to: keep them in L2 (evict-last) or drop them first."""
    priority = "evict_last" if evict_last else "evict_first"
    # Ordered like the loads, so that each policy is created where its loads are (before or after the barrier).
    return Int64(_asm(T.i64(), [], f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;", "=l", True, loc, ip))


@dsl_user_op
def load_16_bytes(
    address: Int64,
    policy: Int64,
    l1_evict_last: bool,
    *,
    loc: ir.Location | None = None,
    ip: ir.InsertionPoint | None = None,
) -> ir.Value:
    """One 16-byte `ld.global` with an L1 priority and an L2 policy; returns vector<4xi32>."""
    l1 = "evict_last" if l1_evict_last else "evict_first"
    i32 = T.i32()
    operands = [Int64(address).ir_value(loc=loc, ip=ip), Int64(policy).ir_value(loc=loc, ip=ip)]
    text = f"ld.global.L1::{l1}.L2::cache_hint.v4.b32 {{$0, $1, $2, $3}}, [$4], $5;"
    words = _asm(llvm.StructType.get_literal([i32] * 4), operands, text, "=r,=r,=r,=r,l,l", True, loc, ip)
    parts = [llvm.extractvalue(i32, words, [i], loc=loc, ip=ip) for i in range(4)]
    return vector.from_elements(ir.VectorType.get([4], Int32.mlir_type), parts, loc=loc, ip=ip)
