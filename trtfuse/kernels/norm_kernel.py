"""CuTeDSL RMSNorm and QK-norm kernels: one pass over each row from DRAM, compile-time specialised.

A row's `threads_per_row` threads each load `vectors_per_thread` vectors of the row (x and weight) into registers, so
x comes from DRAM once and y is written once. Prefill tilings (`reread`) load x a second time for the output, from
L1 or L2, where cache-eviction policies keep it until then, instead of holding it across the reduction. The sum of
squares is reduced in fp32 with butterfly shuffles inside the row's lanes; a row wider than a warp adds one
shared-memory exchange between its warps. QK-norm runs two such problems in one grid: the first blocks take q rows,
the rest k rows. The fused residual add+norm is the same pass with a residual: each thread loads x and the residual,
forms h = D(x + residual), stores h at once and normalises h. Quantizer stages (`NormMath.quant`) are compile-time
options of the same kernels: x (or h) fake-quantized as it is read, r per row, y quantized where it is stored.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, Uint64

from trtfuse.contract import NormParams, QuantParams, WeightMode
from trtfuse.kernels.declaration import TOKEN_MAGIC_NUMERATOR, TOKEN_SHIFT
from trtfuse.kernels.ptx import l2_evict_policy, load_16_bytes
from trtfuse.kernels.quant import (
    FLOAT_CUTLASS_DTYPES,
    QUANT_CUTLASS_DTYPES,
    fake_quantized,
    fake_quantized_scalar,
    quantize_into,
)
from trtfuse.kernels.specs import RopeParams
from trtfuse.kernels.tiling import ACCESS_BYTES, WARP, RotationPlan, RowTiling

CUTLASS_DTYPES = FLOAT_CUTLASS_DTYPES | QUANT_CUTLASS_DTYPES


@dataclass(frozen=True)
class NormMath:
    """The compile-time constants of the formula: folded into the kernel as immediates and branches."""

    params: NormParams
    rounding: str  # the dtype AFTER_CAST rounds x·r to before the weight multiply (contract.rounding_dtype)
    quant: QuantParams | None = None  # the quantizer stages; None: a plain kernel, which traces none of them
    # T, y's dtype before the output quantizer (set with that stage, the normalised one or the products')
    normalised: str | None = None

    def stage(self, name: str) -> object:
        """The quantizer of stage `name` ("input", "rsqrt", "normalised", "cos_product", ...), None when off."""
        return None if self.quant is None else getattr(self.quant, name)


@dataclass(frozen=True)
class _Rows:
    """One normalisation problem of a kernel, as its device code reads it: the pointers (the add+norm's residual
    and h; None elsewhere, and nothing of the residual is traced), the row count, the tiling and the rows' fp32
    partial sums in shared memory. Built while tracing, from the kernel's parameters."""

    x: cute.Pointer
    w: cute.Pointer
    y: cute.Pointer
    rows: Int32
    tiling: RowTiling
    partials: cute.Tensor
    res: cute.Pointer | None = None
    h: cute.Pointer | None = None
    rotation: _Rotation | None = None  # the QK-norm + rotary kernel's rotation of each head row

    def thread_row(self, block: Int32) -> tuple[Int32, Int32, Int32, cutlass.Boolean]:
        """This thread's lane in its row, its row's index in the block and in the problem, and whether that row is
        one of the problem's (rows past the end are predicated per thread group)."""
        tidx, _, _ = cute.arch.thread_idx()
        threads = self.tiling.threads_per_row
        lane = tidx % threads
        row_in_block = tidx // threads
        row = block * self.tiling.rows_per_block + row_in_block
        return lane, row_in_block, row, row < self.rows

    def misalignment(self, math: NormMath) -> Int64:
        """The low address bits the vector path needs clear, of the activations, the outputs and (unless
        weight_mode is NONE, when the kernel never reads it) the weight; 0 when all of them are."""
        ptrs = tuple(ptr for ptr in (self.x, self.res, self.y, self.h) if ptr is not None)
        if self.rotation is not None:
            ptrs = (*ptrs, self.rotation.cos, self.rotation.sin)
        bits = Int64(0)
        for ptr in (*ptrs, self.w) if math.params.weight_mode != WeightMode.NONE else ptrs:
            bits = bits | (ptr.toint() & (_vector_align(ptr, self.tiling) - 1))
        return bits

    def realigned(self) -> _Rows:
        """The problem with its pointers promised the vector path's alignment (checked by the caller), so that its
        accesses compile 16 bytes wide."""
        x, res, w, y, h = (
            None if ptr is None else _realigned(ptr, self.tiling) for ptr in (self.x, self.res, self.w, self.y, self.h)
        )
        rotation = self.rotation
        if rotation is not None:
            cos, sin = (_realigned(ptr, self.tiling) for ptr in (rotation.cos, rotation.sin))
            rotation = dataclasses.replace(rotation, cos=cos, sin=sin)
        return _Rows(x, w, y, self.rows, self.tiling, self.partials, res, h, rotation)


@dataclass(frozen=True)
class RopeConstants:
    """The compile-time half of the QK-norm + rotary kernel's rotation: its parameters and, per part (q, k), the
    register exchange of its tiling (`tiling.rotation_plan`; None: that part's rows take the element path)."""

    params: RopeParams
    plans: tuple[RotationPlan | None, RotationPlan | None]


@dataclass(frozen=True)
class _Rotation:
    """The rotation of one problem's head rows, as its device code reads it: cos and sin ([Bc, S, R]), q's batch B,
    the sequence length S, cos's batch Bc (1 or B), the part's row count, its rows per token (its heads: rows /
    (B·S)) and that count's multiplier (`declaration.TOKEN_SHIFT`), both computed by the launch so that no thread
    divides by B·S, and the constants. Built while tracing."""

    cos: cute.Pointer
    sin: cute.Pointer
    batch: Int32
    seq_len: Int32
    cos_batch: Int32
    rows: Int32
    rows_per_token: Int32
    token_magic: Int32
    params: RopeParams
    plan: RotationPlan | None


@cute.jit
def _cos_row(rotation: _Rotation, row: Int32) -> Int32:
    """The cos/sin row of norm row `row`: (b if Bc == B else 0)·S + s of its batch b and position s. A row's tables
    are loaded only once it is known, so this lies on the decode latency path, where each integer division by a
    runtime value costs about 0.1 µs (docs/performance.md): each layout takes as few as its tables need, behind
    branches every thread of the launch takes alike. Unsigned: every operand is a count or an index.

    Token-major rows are B·S tokens of H rows: the token t = row / H (a multiply-shift, `TOKEN_SHIFT`) is b·S + s
    itself, the table row when the tables have q's batch or there is one sequence; a table shared by B > 1 sequences
    takes s = t mod S. Head-major rows are B batches of H·S rows, s the fastest: s = row mod S, and b = row / (H·S)
    only for per-batch tables."""
    row, per_token, seq_len = Uint32(row), Uint32(rotation.rows_per_token), Uint32(rotation.seq_len)
    shared = (rotation.cos_batch == 1) & (rotation.batch != 1)
    table_row = Uint32(0)
    if cutlass.const_expr(rotation.params.layout == "token_major"):
        table_row = _token(rotation, row)
        if shared:
            table_row = table_row % seq_len
    else:
        table_row = row % seq_len
        if rotation.cos_batch != 1:
            table_row = row // (per_token * seq_len) * seq_len + table_row
    return Int32(table_row)


@cute.jit
def _token(rotation: _Rotation, row: Uint32) -> Uint32:
    """The token b·S + s of token-major norm row `row`: row / H, by the launch's multiply-shift where it is exact
    (`declaration.TOKEN_SHIFT`), else by a division."""
    token = Uint32(0)
    if Int64(rotation.rows) * Int64(rotation.rows_per_token) <= Int64(TOKEN_MAGIC_NUMERATOR):
        token = Uint32((Uint64(row) * Uint64(Uint32(rotation.token_magic))) >> TOKEN_SHIFT)
    else:
        token = row // Uint32(rotation.rows_per_token)
    return token


@cute.jit
def _head_major_start(rotation: _Rotation, row: Int32, hidden: cutlass.Constexpr) -> Int64:
    """Where token-major norm row `row` (of `hidden` elements: one head row, or a token's heads) starts in the
    outputs' [B, H, S, D]: its first head row's [b, h, s]. With one token per sequence (decode) that is where it
    starts in the inputs' layout, so decode computes nothing more; a prefill divides only for B > 1."""
    start = Int64(row) * hidden
    seq_len = Uint32(rotation.seq_len)
    if seq_len != Uint32(1):
        heads_in_row = hidden // rotation.params.head_dim
        token = _token(rotation, Uint32(row))
        first_head = (Uint32(row) - token * Uint32(rotation.rows_per_token)) * heads_in_row
        heads = Uint32(rotation.rows_per_token) * heads_in_row
        batch = Uint32(0)
        if rotation.batch != 1:
            batch = token // seq_len
        position = token - batch * seq_len
        start = ((Int64(batch) * Int64(heads) + Int64(first_head)) * Int64(seq_len) + Int64(position)) * (
            rotation.params.head_dim
        )
    return start


def _output_row(problem: _Rows, row: Int32, offset: Int64, vec: int) -> cute.Tensor:
    """y's (vector, vector index) view of norm row `row`, whose inputs start `offset` elements in: at the same
    offset, or, where the rotation moves heads (`RopeParams.moves_heads`), each head row at its [b, h, s] of the
    outputs' [B, H, S, D], the row's heads S·D elements apart. Traced inline (its branches are compile-time)."""
    tiling, rotation = problem.tiling, problem.rotation
    flat = cute.make_layout((vec, tiling.hidden // vec), stride=(1, vec))
    if rotation is None or not rotation.params.moves_heads:
        return cute.make_tensor(problem.y + offset, flat)
    head_dim = rotation.params.head_dim
    start = cute.assume(_head_major_start(rotation, row, tiling.hidden), divby=vec)
    if tiling.hidden == head_dim:
        return cute.make_tensor(problem.y + start, flat)
    heads = tiling.hidden // head_dim
    head_stride = rotation.seq_len * head_dim
    layout = cute.make_layout((vec, (head_dim // vec, heads)), stride=(1, (vec, head_stride)))
    return cute.make_tensor(problem.y + start, layout)


def smem_bytes(tiling: RowTiling) -> int:
    """One fp32 partial sum per warp of each row; allocated always (a few bytes), read only when a row spans warps."""
    return 4 * tiling.rows_per_block * tiling.warps_per_row


@cute.jit
def _for_each_slot(lane: Int32, tiling: cutlass.Constexpr, visit: cutlass.Constexpr):
    """Call visit(vector index in the row, slot) for each of this thread's slots.

    Slot k of a thread is vector `lane + k * threads_per_row`: consecutive lanes touch consecutive 16-byte vectors,
    so each warp-wide access is fully coalesced. Only the last slot can fall past the row end (when the threads do
    not divide the row's vectors): it alone is predicated.
    """
    threads = tiling.threads_per_row
    for k in cutlass.range_constexpr(tiling.vectors_per_thread):
        index = lane + k * threads
        if cutlass.const_expr((k + 1) * threads > tiling.vectors_per_row):
            if index < tiling.vectors_per_row:
                visit(index, k)
        else:
            visit(index, k)


@cute.jit
def _load_slots(row: cute.Tensor, slots: cute.Tensor, lane: Int32, tiling: cutlass.Constexpr):
    """Global row (vector, vector index) -> this thread's registers (vector, slot), plain accesses."""
    _for_each_slot(lane, tiling, lambda index, k: cute.autovec_copy(row[None, index], slots[None, k]))


@cute.jit
def _store_slots(slots: cute.Tensor, row: cute.Tensor, lane: Int32, tiling: cutlass.Constexpr):
    _for_each_slot(lane, tiling, lambda index, k: cute.autovec_copy(slots[None, k], row[None, index]))


@cute.jit
def _store_half_pair(
    pair: cute.Tensor, row: cute.Tensor, start: Int32, store: cutlass.Constexpr, tiling: cutlass.Constexpr
):
    half = tiling.vector // 2
    offset = cute.assume(start + store * tiling.vector, divby=half)
    target = cute.make_tensor(row.iterator + offset, cute.make_layout(half))
    cute.autovec_copy(pair[None, store], cute.recast_tensor(target, Int32))


@cute.jit
def _store_slots_paired(
    slots: cute.Tensor, row: cute.Tensor, lane: Int32, row_ok: cutlass.Boolean, tiling: cutlass.Constexpr
):
    """`_store_slots` for 32-byte vectors (fp32 y of a 16-bit x), in 16-byte stores that each fill whole sectors.

    Stored as they are, a warp's first 16-byte store would write the first half of every lane's 32-byte sector and
    its second store the other halves: every store half-fills 32 sectors. Instead lanes 2m and 2m+1 swap one half
    (one shuffle per word): the first store writes the even lane's vector (its own first half, the odd lane the
    second half it received), the second store the odd lane's. Executed by every lane (the shuffles are warp-wide);
    only the stores are predicated.
    """
    threads = tiling.threads_per_row
    half = tiling.vector // 2
    odd = lane % 2 == 1
    words = cute.recast_tensor(slots, Int32)
    pair = cute.make_rmem_tensor(cute.make_layout((half, 2), stride=(1, half)), Int32)
    for k in cutlass.range_constexpr(tiling.vectors_per_thread):
        for i in cutlass.range_constexpr(half):
            first, second = words[i, k], words[half + i, k]
            # The even lane keeps its first half and sends its second; the odd lane the reverse.
            received = cute.arch.shuffle_sync_bfly(Int32(cutlass.select_(odd, first, second)), 1)
            pair[i, 0] = Int32(cutlass.select_(odd, received, first))
            pair[i, 1] = Int32(cutlass.select_(odd, second, received))
        index = lane + k * threads
        # Element offsets of the two stores: the even lane's vector (half 0 from it, half 1 from the odd lane),
        # then the odd lane's.
        start = index * tiling.vector - odd.to(Int32) * half
        for store in cutlass.range_constexpr(2):
            if row_ok:
                # Only the last slot can fall past the row end (as in `_for_each_slot`), for one store or both.
                if cutlass.const_expr((k + 1) * threads > tiling.vectors_per_row):
                    if index - odd.to(Int32) + store < tiling.vectors_per_row:
                        _store_half_pair(pair, row, start, store, tiling)
                else:
                    _store_half_pair(pair, row, start, store, tiling)


@cute.jit
def _load_slots_with_policy(
    row: cute.Tensor, slots: cute.Tensor, lane: Int32, tiling: cutlass.Constexpr, keep: cutlass.Constexpr
):
    """`_load_slots` from global memory, 16 bytes per access, marked evict-last (`keep`) or evict-first in both L1
    and L2."""
    words = cute.recast_tensor(slots, Int32)
    policy = l2_evict_policy(keep)

    def load(index: Int32, k: int) -> None:
        address = row[None, index].iterator.toint()
        words[None, k].store(cute.TensorSSA(load_16_bytes(address, policy, keep), (4,), Int32))

    _for_each_slot(lane, tiling, load)


@cute.jit
def _residual_sum(r_x: cute.Tensor, r_res: cute.Tensor) -> cute.TensorSSA:
    """h = D(x + residual) from the two register fragments: the sum in fp32, rounded once to their dtype D (for
    fp16/bf16 the correctly rounded 16-bit sum; for fp32 the fp32 sum)."""
    return (r_x.load().to(Float32) + r_res.load().to(Float32)).to(r_x.element_type)


@cute.jit
def _row_rstd(
    sum_sq: Float32,
    lane: Int32,
    row_in_block: Int32,
    partials: cute.Tensor,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
) -> Float32:
    """rsqrt(mean of squares + epsilon) of this thread's row, from this thread's partial sum of squares; every
    thread of the block must call this (a row wider than a warp meets the others at a barrier)."""
    threads = tiling.threads_per_row
    # Butterfly over the row's lanes; sub-warp rows use the low log2(threads) rounds and stay inside their group.
    sum_sq = cute.arch.warp_reduction(sum_sq, lambda a, b: a + b, threads_in_group=min(threads, WARP))
    if cutlass.const_expr(tiling.warps_per_row > 1):
        # A row spans several warps: one shared-memory exchange of the per-warp sums, one barrier.
        if lane % WARP == 0:
            partials[row_in_block, lane // WARP] = sum_sq
        cute.arch.barrier()
        sum_sq = Float32(0.0)
        for w in cutlass.range_constexpr(tiling.warps_per_row):
            sum_sq = sum_sq + partials[row_in_block, w]
    variance = sum_sq / Float32(tiling.hidden) + Float32(math.params.epsilon)
    quantizer = math.stage("rsqrt")
    if cutlass.const_expr(quantizer is None):
        rstd = cute.math.rsqrt(variance, fastmath=True)
    else:
        # The graph's r, Sqrt then Reciprocal, each correctly rounded: r' = DQ(Q(r)) is a step function of r, and
        # the approximate rsqrt's last-bit error would put some rows one step away.
        rstd = fake_quantized_scalar(Float32(1.0) / cute.math.sqrt(variance), quantizer)
    return rstd


@cute.jit
def _row_values(slots: cute.Tensor, math: cutlass.Constexpr) -> cute.TensorSSA:
    """The values the norm reads from a fragment of x (or h), as float32: DQ(Q(·)) with the input stage on."""
    values = slots.load().to(Float32)
    if cutlass.const_expr(math.stage("input") is not None):
        values = fake_quantized(values, math.stage("input"), slots.layout)
    return values


@cute.jit
def _store_normalized(
    r_y: cute.Tensor, x: cute.TensorSSA, rstd: Float32, r_w: cute.Tensor | None, math: cutlass.Constexpr
):
    """y into its fragment: rounded to T (y's own dtype) or, with the output stage on, to T and then quantized."""
    quantizer = math.stage("output")
    if cutlass.const_expr(quantizer is None):
        r_y.store(_normalized(x, rstd, r_w, r_y.element_type, math))
    else:
        y = _normalized(x, rstd, r_w, FLOAT_CUTLASS_DTYPES[math.normalised], math)
        quantize_into(y.to(Float32), quantizer, r_y)


@cute.jit
def _normalized(
    x: cute.TensorSSA, rstd: Float32, r_w: cute.Tensor | None, out_dtype: cutlass.Constexpr, math: cutlass.Constexpr
) -> cute.TensorSSA:
    """y from x (fp32), the row's rstd and the weight's registers (None without a weight), per weight_mode."""
    rounding = CUTLASS_DTYPES[math.rounding]
    if cutlass.const_expr(r_w is None):
        return (x * rstd).to(out_dtype)
    if cutlass.const_expr(
        math.params.weight_mode == WeightMode.AFTER_CAST
        and math.params.weight_offset == 0.0
        and r_w.element_type == out_dtype
        and rounding == out_dtype
    ):
        # Llama's semantics with the weight in the output dtype: the product of two fp16 or two bf16 values is exact in
        # fp32, so one multiply in that dtype (packed, fewer registers) rounds exactly as the fp32 path does (for
        # fp32 the two paths are the same operations).
        return (x * rstd).to(out_dtype) * r_w.load()
    return _weighted(x, rstd, r_w, math).to(out_dtype)


@cute.jit
def _weighted(x: cute.TensorSSA, rstd: Float32, r_w: cute.Tensor, math: cutlass.Constexpr) -> cute.TensorSSA:
    """y in float32 before its rounding to T, per weight_mode (AFTER_CAST's rounding to R included)."""
    w = r_w.load().to(Float32)
    if cutlass.const_expr(math.params.weight_offset != 0.0):
        w = w + Float32(math.params.weight_offset)
    if cutlass.const_expr(math.params.weight_mode == WeightMode.AFTER_CAST):
        return (x * rstd).to(CUTLASS_DTYPES[math.rounding]).to(Float32) * w
    return x * rstd * w


@cute.jit
def _normalized_float(
    x: cute.TensorSSA, rstd: Float32, r_w: cute.Tensor | None, math: cutlass.Constexpr
) -> cute.TensorSSA:
    """y in float32 before its final rounding: what the rotation reads; with the normalised stage on, y rounded to
    T and through its DQ(Q(·)) (a T value), as the graph's pair on the norm's output hands it to the rotation."""
    y = x * rstd if cutlass.const_expr(r_w is None) else _weighted(x, rstd, r_w, math)
    quantizer = math.stage("normalised")
    if cutlass.const_expr(quantizer is not None):
        rounded = y.to(FLOAT_CUTLASS_DTYPES[math.normalised]).to(Float32)
        y = fake_quantized(rounded, quantizer, cute.make_layout(y.shape))
    return y


@cute.jit
def _store_float(r_y: cute.Tensor, y: cute.TensorSSA, math: cutlass.Constexpr):
    """A float32 result into y's fragment: rounded once to T, then quantized where the output stage is on."""
    quantizer = math.stage("output")
    if cutlass.const_expr(quantizer is None):
        r_y.store(y.to(r_y.element_type))
    else:
        quantize_into(y.to(FLOAT_CUTLASS_DTYPES[math.normalised]).to(Float32), quantizer, r_y)


@cute.jit
def _load_rotation(
    rotation: _Rotation,
    row: Int32,
    rows: Int32,
    lane: Int32,
    r_cos: cute.Tensor,
    r_sin: cute.Tensor,
    tiling: cutlass.Constexpr,
):
    """cos and sin of this thread's rotated slots, from the row's cos/sin row (vector-wide, as x); a slot that is
    not rotated keeps the zeros it was filled with."""
    plan, vec = rotation.plan, tiling.vector
    rotary_layout = cute.make_layout((vec, plan.rotary_vectors), stride=(1, vec))
    # 64-bit: (cos rows) x R can pass 2^31 elements; R is a multiple of the vector, so cos rows stay vector-aligned.
    offset = cute.assume(Int64(_cos_row(rotation, row)) * rotation.params.rotary_dim, divby=vec)
    g_cos = cute.make_tensor(rotation.cos + offset, rotary_layout)
    g_sin = cute.make_tensor(rotation.sin + offset, rotary_layout)
    for k in cutlass.range_constexpr(tiling.vectors_per_thread):
        if cutlass.const_expr(plan.source_slots[k] is not None):
            index = lane + k * tiling.threads_per_row
            position = index % plan.head_vectors
            rotated = position < plan.rotary_vectors
            if cutlass.const_expr((k + 1) * tiling.threads_per_row > tiling.vectors_per_row):
                # Only the last slot can fall past the row end (as in `_for_each_slot`).
                rotated = rotated & (index < tiling.vectors_per_row)
            if rotated:
                cute.autovec_copy(g_cos[None, position], r_cos[None, k])
                cute.autovec_copy(g_sin[None, position], r_sin[None, k])


def _rotated_value(y: Float32, other: Float32, cos: cutlass.Numeric, sin: cutlass.Numeric, math: NormMath) -> Float32:
    """y·cos + other·sin as the contract computes it (docs/plugin-nodes.md, "Rotary embedding"): each product
    rounded to float32, then their sum, three explicitly rounded operations (`.rn`), which no compiler pass
    contracts into a fused multiply-add, so every kernel of a spec (a quantized one too) and the lowering agree.
    With the part's product stages (`math.stage("cos_product")`), as the graph computes ModelOpt's rotation: y and
    its partner rounded to T first, each product rounded to T and through its stage's DQ(Q(·)) (in T), and the
    sum rounded to T."""
    nearest = cute.math.RoundingMode.NEAREST_EVEN
    products = math.stage("cos_product") is not None
    if products:
        y, other = _rounded(y, math.normalised), _rounded(other, math.normalised)
    first = cute.math.mul(y, Float32(cos), rounding=nearest)
    second = cute.math.mul(other, Float32(sin), rounding=nearest)
    if products:
        first = fake_quantized_scalar(_rounded(first, math.normalised), math.stage("cos_product"))
        second = fake_quantized_scalar(_rounded(second, math.normalised), math.stage("sin_product"))
    total = cute.math.add(first, second, rounding=nearest)
    if products:
        total = _rounded(total, math.normalised)
    return total


def _rounded(value: Float32, dtype: str) -> Float32:
    """`value` rounded once to the float dtype `dtype` (to nearest even), as float32."""
    one = cute.make_layout(1)
    fragment = cute.make_rmem_tensor(one, Float32)
    fragment[0] = value
    fragment.store(fragment.load().to(FLOAT_CUTLASS_DTYPES[dtype]).to(Float32))
    return fragment[0]


@cute.jit
def _store_rotated(
    r_y: cute.Tensor,
    y: cute.TensorSSA,
    r_cos: cute.Tensor,
    r_sin: cute.Tensor,
    lane: Int32,
    plan: cutlass.Constexpr,
    rotation: cutlass.Constexpr,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    """out = y·cos + rot(y)·sin on this thread's rotated slots, y elsewhere, into y's fragment (`_store_float`).

    y is the float32 normalised value of every slot (vector, slot). A slot's partner values come from slot
    `plan.source_slots[k]` of the lane its partner vector sits in: one shuffle of that slot from every lane of the
    warp (or this lane's own register). Executed by every thread of the block (the shuffles are warp-wide)."""
    vec, threads = tiling.vector, tiling.threads_per_row
    layout = cute.make_layout((vec, tiling.vectors_per_thread), stride=(1, vec))
    r_f = cute.make_rmem_tensor(layout, Float32)
    r_f.store(y)
    r_out = cute.make_rmem_tensor(layout, Float32)
    r_out.store(y)
    r_partner = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
    half = plan.rotary_vectors // 2
    # A partial rotation passes the heads' last vectors through: each slot then tests its position.
    partial = plan.rotary_vectors < plan.head_vectors
    warp_lane = cute.arch.lane_idx()
    for k in cutlass.range_constexpr(tiling.vectors_per_thread):
        source = plan.source_slots[k]
        if cutlass.const_expr(source is not None):
            position = (lane + k * threads) % plan.head_vectors
            rotated = position < plan.rotary_vectors
            first_half = position < half
            if cutlass.const_expr(plan.shuffles[k]):
                # The partner vector is `half` vectors on or back in the head; its lane is that many lanes away,
                # less the slots between (its slot is `source`). A slot passed through reads its own lane.
                shift = Int32(cutlass.select_(first_half, Int32(half), Int32(-half))) + (k - source) * threads
                if cutlass.const_expr(partial):
                    shift = Int32(cutlass.select_(rotated, shift, Int32(0)))
                for i in cutlass.range_constexpr(vec):
                    r_partner[i] = cute.arch.shuffle_sync(r_f[i, source], warp_lane + shift)
            else:
                r_partner.store(r_f[None, source].load())
            for i in cutlass.range_constexpr(vec):
                if cutlass.const_expr(rotation.rotation == "half"):
                    # rotate_half: -y[j + R/2] in the first half, y[j - R/2] in the second.
                    other = r_partner[i]
                    other = Float32(cutlass.select_(first_half, -other, other))
                elif cutlass.const_expr(i % 2 == 0):
                    other = -r_partner[i + 1]  # interleaved pairs: -y[2i + 1] at 2i, y[2i] at 2i + 1
                else:
                    other = r_partner[i - 1]
                value = _rotated_value(r_f[i, k], other, r_cos[i, k], r_sin[i, k], math)
                if cutlass.const_expr(partial):
                    value = Float32(cutlass.select_(rotated, value, r_f[i, k]))
                r_out[i, k] = value
    _store_float(r_y, r_out.load(), math)


@cute.jit
def _normalize_block_rows(problem: _Rows, block: Int32, math: cutlass.Constexpr):
    """Normalise the rows of block number `block` (of this problem); every thread of the block must call this.

    With a residual and h (the add+norm kernel) the row normalised is h = D(x + residual), written to h; without
    them it is x."""
    tiling = problem.tiling
    vec = tiling.vector
    threads = tiling.threads_per_row
    # Only the last slot of a thread can fall past the row end (when threads do not divide the row's vectors): it
    # alone is predicated, and zeroed first so that it adds nothing to the sum of squares.
    ragged = tiling.vectors_per_row % threads != 0
    has_weight = math.params.weight_mode != WeightMode.NONE
    has_residual = problem.res is not None

    lane, row_in_block, row, row_ok = problem.thread_row(block)

    # (vector, vector index) view of one row: mode 0 is contiguous, so each column is one 16-byte access.
    row_layout = cute.make_layout((vec, tiling.vectors_per_row), stride=(1, vec))
    # This thread's share of the row, (vector, slot), in registers.
    slots_layout = cute.make_layout((vec, tiling.vectors_per_thread), stride=(1, vec))
    # 64-bit row offset: rows·hidden overflows 32 bits for long prefill batches of wide rows. It is a multiple of the
    # vector (the vector divides the row): each row start is as aligned as the tensor, so accesses stay vector-wide.
    offset = cute.assume(Int64(row) * tiling.hidden, divby=vec)
    g_x = cute.make_tensor(problem.x + offset, row_layout)
    g_y = _output_row(problem, row, offset, vec)
    r_x = cute.make_rmem_tensor(slots_layout, problem.x.dtype)
    r_y = cute.make_rmem_tensor(slots_layout, problem.y.dtype)
    if cutlass.const_expr(has_weight):
        r_w = cute.make_rmem_tensor(slots_layout, problem.w.dtype)
    # The residual's slots have x's layout and dtype; h = D(x + residual) then replaces x in r_x.
    inputs = ((g_x, r_x),)
    if cutlass.const_expr(has_residual):
        g_h = cute.make_tensor(problem.h + offset, row_layout)
        r_res = cute.make_rmem_tensor(slots_layout, problem.res.dtype)
        inputs = ((g_x, r_x), (cute.make_tensor(problem.res + offset, row_layout), r_res))

    if cutlass.const_expr(ragged):
        for _, slots in inputs:
            slots[None, tiling.vectors_per_thread - 1].fill(0)
    rotation = problem.rotation
    if cutlass.const_expr(rotation is not None):
        r_cos = cute.make_rmem_tensor(slots_layout, rotation.cos.dtype)
        r_sin = cute.make_rmem_tensor(slots_layout, rotation.sin.dtype)
        if cutlass.const_expr(rotation.plan.rotary_vectors < rotation.plan.head_vectors or ragged):
            # Slots never loaded (passed through, or past the row end) are read by the rotation's arithmetic, whose
            # result a select then drops: zeros rather than undefined registers.
            r_cos.fill(0)
            r_sin.fill(0)
    if row_ok:
        for row_in, slots in inputs:
            if cutlass.const_expr(tiling.reread):
                # Read again after the reduction: ask L1 and L2 to keep the row until then.
                _load_slots_with_policy(row_in, slots, lane, tiling, True)
            else:
                _load_slots(row_in, slots, lane, tiling)
        if cutlass.const_expr(has_weight):
            _load_slots(cute.make_tensor(problem.w, row_layout), r_w, lane, tiling)
        if cutlass.const_expr(rotation is not None):
            _load_rotation(rotation, row, problem.rows, lane, r_cos, r_sin, tiling)
    if cutlass.const_expr(has_residual):
        # h is stored before the reduction: its registers are then needed only for the sum and the output.
        r_x.store(_residual_sum(r_x, r_res))
        if row_ok:
            _store_slots(r_x, g_h, lane, tiling)

    x = _row_values(r_x, math)
    rstd = _row_rstd(
        (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), lane, row_in_block, problem.partials, tiling, math
    )

    if cutlass.const_expr(tiling.reread):
        # The row again, rather than its fp32 copy held in registers across the reduction: an L1 or L2 hit, marked
        # evict-first since this is its last use, so its lines make room for the rows still to come. With a
        # residual, h is formed again from x and the residual, bit for bit as before.
        if row_ok:
            for row_in, slots in inputs:
                _load_slots_with_policy(row_in, slots, lane, tiling, False)
        if cutlass.const_expr(has_residual):
            r_x.store(_residual_sum(r_x, r_res))
        x = _row_values(r_x, math)
    if cutlass.const_expr(rotation is None):
        _store_normalized(r_y, x, rstd, r_w if cutlass.const_expr(has_weight) else None, math)
    else:
        y = _normalized_float(x, rstd, r_w if cutlass.const_expr(has_weight) else None, math)
        _store_rotated(r_y, y, r_cos, r_sin, lane, rotation.plan, rotation.params, tiling, math)

    if cutlass.const_expr(tiling.paired_stores):
        _store_slots_paired(r_y, g_y, lane, row_ok, tiling)
    elif row_ok:
        _store_slots(r_y, g_y, lane, tiling)


@cute.jit
def _normalize_block_rows_by_element(problem: _Rows, block: Int32, math: cutlass.Constexpr):
    """`_normalize_block_rows` for pointers the tiling's vectors do not fit, in the same threads: one element per
    access in a rolled loop, x (and the residual, h formed again) read twice. Slow, but it needs few registers, so
    an AOT kernel holding both paths keeps its vector path's register count (its occupancy)."""
    tiling = problem.tiling
    threads = tiling.threads_per_row
    has_weight = math.params.weight_mode != WeightMode.NONE
    has_residual = problem.res is not None
    lane, row_in_block, row, row_ok = problem.thread_row(block)
    # (1, element index): column i is element i, so the per-element copies below read one element each.
    row_layout = cute.make_layout((1, tiling.hidden), stride=(1, 1))
    offset = Int64(row) * tiling.hidden
    g_x = cute.make_tensor(problem.x + offset, row_layout)
    g_y = cute.make_tensor(problem.y + offset, row_layout)
    g_w = cute.make_tensor(problem.w, row_layout)
    one = cute.make_layout((1, 1), stride=(1, 1))
    r_x = cute.make_rmem_tensor(one, problem.x.dtype)
    r_y = cute.make_rmem_tensor(one, problem.y.dtype)
    r_w = cute.make_rmem_tensor(one, problem.w.dtype)
    if cutlass.const_expr(has_residual):
        g_res = cute.make_tensor(problem.res + offset, row_layout)
        g_h = cute.make_tensor(problem.h + offset, row_layout)
        r_res = cute.make_rmem_tensor(one, problem.res.dtype)

    sum_sq = Float32(0.0)
    if row_ok:
        for index in cutlass.range(lane, tiling.hidden, threads, unroll=1):
            cute.autovec_copy(g_x[None, index], r_x[None, 0])
            if cutlass.const_expr(has_residual):
                cute.autovec_copy(g_res[None, index], r_res[None, 0])
                r_x.store(_residual_sum(r_x, r_res))
                cute.autovec_copy(r_x[None, 0], g_h[None, index])
            x = _row_values(r_x, math)
            sum_sq = sum_sq + (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    rstd = _row_rstd(sum_sq, lane, row_in_block, problem.partials, tiling, math)
    if row_ok:
        if cutlass.const_expr(problem.rotation is not None):
            _rotate_row_by_element(problem, row, lane, rstd, math)
        else:
            for index in cutlass.range(lane, tiling.hidden, threads, unroll=1):
                cute.autovec_copy(g_x[None, index], r_x[None, 0])
                if cutlass.const_expr(has_residual):
                    cute.autovec_copy(g_res[None, index], r_res[None, 0])
                    r_x.store(_residual_sum(r_x, r_res))
                if cutlass.const_expr(has_weight):
                    cute.autovec_copy(g_w[None, index], r_w[None, 0])
                weight = r_w if cutlass.const_expr(has_weight) else None
                _store_normalized(r_y, _row_values(r_x, math), rstd, weight, math)
                cute.autovec_copy(r_y[None, 0], g_y[None, index])


@cute.jit
def _element_value(g_x: cute.Tensor, g_w: cute.Tensor, index: Int32, rstd: Float32, math: cutlass.Constexpr) -> Float32:
    """The float32 normalised value of element `index` of a row (`_normalized_float` of one element)."""
    one = cute.make_layout((1, 1), stride=(1, 1))
    r_x = cute.make_rmem_tensor(one, g_x.element_type)
    cute.autovec_copy(g_x[None, index], r_x[None, 0])
    weight = None
    if cutlass.const_expr(math.params.weight_mode != WeightMode.NONE):
        weight = cute.make_rmem_tensor(one, g_w.element_type)
        cute.autovec_copy(g_w[None, index], weight[None, 0])
    r_f = cute.make_rmem_tensor(one, Float32)
    r_f.store(_normalized_float(_row_values(r_x, math), rstd, weight, math))
    return r_f[0]


@cute.jit
def _rotate_row_by_element(problem: _Rows, row: Int32, lane: Int32, rstd: Float32, math: cutlass.Constexpr):
    """The element path's output loop for a rotated row: each element's normalised value and, where it is rotated,
    its partner's (read and normalised by this thread too: no register exchange) and its cos and sin."""
    tiling, rotation = problem.tiling, problem.rotation
    params = rotation.params
    head_dim, rotary_dim, half = params.head_dim, params.rotary_dim, params.rotary_dim // 2
    row_layout = cute.make_layout((1, tiling.hidden), stride=(1, 1))
    offset = Int64(row) * tiling.hidden
    g_x = cute.make_tensor(problem.x + offset, row_layout)
    g_y = _output_row(problem, row, offset, 1)
    g_w = cute.make_tensor(problem.w, row_layout)
    rotary_layout = cute.make_layout((1, rotary_dim), stride=(1, 1))
    cos_offset = Int64(_cos_row(rotation, row)) * rotary_dim
    g_cos = cute.make_tensor(rotation.cos + cos_offset, rotary_layout)
    g_sin = cute.make_tensor(rotation.sin + cos_offset, rotary_layout)
    one = cute.make_layout((1, 1), stride=(1, 1))
    r_cos = cute.make_rmem_tensor(one, rotation.cos.dtype)
    r_sin = cute.make_rmem_tensor(one, rotation.sin.dtype)
    r_out = cute.make_rmem_tensor(one, Float32)
    r_y = cute.make_rmem_tensor(one, problem.y.dtype)
    for index in cutlass.range(lane, tiling.hidden, tiling.threads_per_row, unroll=1):
        value = _element_value(g_x, g_w, index, rstd, math)
        r_out[0] = value
        j = index % head_dim
        if j < rotary_dim:
            if cutlass.const_expr(params.rotation == "half"):
                first = j < half
                step = Int32(cutlass.select_(first, Int32(half), Int32(-half)))
            else:
                first = j % 2 == 0
                step = Int32(cutlass.select_(first, Int32(1), Int32(-1)))
            other = _element_value(g_x, g_w, index + step, rstd, math)
            cute.autovec_copy(g_cos[None, j], r_cos[None, 0])
            cute.autovec_copy(g_sin[None, j], r_sin[None, 0])
            other = Float32(cutlass.select_(first, -other, other))
            r_out[0] = _rotated_value(value, other, r_cos[0], r_sin[0], math)
        _store_float(r_y, r_out.load(), math)
        cute.autovec_copy(r_y[None, 0], g_y[None, index])


def _block_and_partials(*tilings: RowTiling) -> tuple:
    """This block's index, then per tiling the fp32 partial sums of its rows' warps in shared memory (`smem_bytes`
    of each): the first thing every kernel traces."""
    block, _, _ = cute.arch.block_idx()
    smem = cutlass.memory.SmemAllocator()
    layouts = [cute.make_layout((t.rows_per_block, t.warps_per_row), stride=(t.warps_per_row, 1)) for t in tilings]
    return (block, *(smem.allocate_tensor(Float32, layout, byte_alignment=4) for layout in layouts))


@cute.jit
def _normalize_rows(
    problem: _Rows,
    block: Int32,
    math: cutlass.Constexpr,
    aligned: cutlass.Boolean | None = None,
    first_block: Int32 | None = None,
):
    """`_normalize_block_rows` of grid block `block`: the problem's block `block - first_block` where its blocks
    start at `first_block` (QK-norm's k rows, after q's). With `aligned` (an AOT kernel's `_aligned`), the vector
    path on the pointers promised that alignment where it holds, else the element path."""
    # Each path forms the problem's block index itself: hoisted before the branch, the subtraction would move in
    # the AOT QK-norm kernels' PTX (tests/kernels/test_add_norm_ptx_identity.py pins it).
    if cutlass.const_expr(aligned is None):
        _normalize_block_rows(problem, _own_block(block, first_block), math)
    elif cutlass.const_expr(aligned is False):
        # No vector path (a rotation without a register exchange in its tiling): every pointer by element.
        _normalize_block_rows_by_element(problem, _own_block(block, first_block), math)
    else:
        if aligned:
            _normalize_block_rows(problem.realigned(), _own_block(block, first_block), math)
        else:
            _normalize_block_rows_by_element(problem, _own_block(block, first_block), math)


def _own_block(block: Int32, first_block: Int32 | None) -> Int32:
    return block if first_block is None else block - first_block


def _part_maths(math: NormMath | tuple[NormMath, NormMath]) -> tuple[NormMath, NormMath]:
    """q's and k's math: a quantized QK-norm's pair (each part's own output quantizer), or one for both."""
    return math if isinstance(math, tuple) else (math, math)


@cute.jit
def _normalize_q_or_k(
    block: Int32, q_blocks: Int32, q: _Rows, k: _Rows, math: cutlass.Constexpr, aligned: cutlass.Boolean | None = None
):
    """QK-norm's two problems in one grid: blocks [0, q_blocks) normalise q's rows, the rest k's (the branch is
    uniform per block, so the barrier of a multi-warp row stays inside one side); `aligned` as `_normalize_rows`
    takes it, for both; `math` one NormMath or (q's, k's)."""
    q_math, k_math = _part_maths(math)
    if block < q_blocks:
        _normalize_rows(q, block, q_math, aligned)
    else:
        _normalize_rows(k, block, k_math, aligned, q_blocks)


def _blocks(rows: Int32, tiling: RowTiling) -> Int32:
    """The blocks of `tiling`'s rows per block that `rows` rows take."""
    return (rows + tiling.rows_per_block - 1) // tiling.rows_per_block


def _launch_rms_norm(kernel: object, rows: Int32, stream: cuda.CUstream, tiling: RowTiling) -> None:
    """The launch of every RMSNorm-grid kernel (traced inside its host entry): one block per `rows_per_block` rows;
    at least one block, so a 0-row call is a valid no-op."""
    kernel.launch(
        grid=[cutlass.max(_blocks(rows, tiling), 1), 1, 1],
        block=[tiling.block_threads, 1, 1],
        smem=smem_bytes(tiling),
        stream=stream,
        # `.minnctapersm`: ptxas must fit this many blocks on an SM, so it caps the registers per thread (0: no cap).
        min_blocks_per_mp=tiling.min_blocks_per_sm,
        # With that floor CuTeDSL would otherwise read the GPU's shared memory size while compiling; -1 is the
        # driver's default carveout, and lets a machine without a GPU compile.
        preferred_smem_carveout=-1 if tiling.min_blocks_per_sm > 1 else None,
    )


# Each op has a kernel for the JIT path (pointers promised the tiling's alignment by the caller) and an
# ahead-of-time one (TensorRT launches it itself): parameters in TensorRT's order (inputs, int32 scalars, outputs),
# pointers promised only element alignment, and the 16-byte path chosen inside the kernel. One host entry per op
# launches either; the AOT kernel's is only traced, so that its device entry gets the launch's `.reqntid` and
# `.minnctapersm` (TensorRT launches it with the grid of the kernel's launch declaration).


def _vector_align(ptr: cute.Pointer, tiling: RowTiling) -> int:
    """The alignment (bytes) the vector path needs of `ptr`: one vector, at most one 16-byte access."""
    return min(ACCESS_BYTES, tiling.vector * ptr.dtype.width // 8)


def _realigned(ptr: cute.Pointer, tiling: RowTiling) -> cute.Pointer:
    return cute.make_ptr(ptr.dtype, ptr.toint(), cute.AddressSpace.gmem, assumed_align=_vector_align(ptr, tiling))


def _aligned(math: NormMath, *problems: _Rows) -> cutlass.Boolean | None:
    """Whether every pointer of the problems that the vector path needs aligned is (uniform across the grid, so that
    every thread takes the same path and a row's barrier stays inside one of them); None where every tiling's
    vector is one element, which needs no check; False where a rotated problem has no vector path."""
    if any(problem.rotation is not None and problem.rotation.plan is None for problem in problems):
        return False
    if all(problem.tiling.vector == 1 for problem in problems):
        return None
    return functools.reduce(operator.or_, (problem.misalignment(math) for problem in problems)) == 0


@cute.kernel
def _rms_norm_kernel(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    rows: Int32,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, partials = _block_and_partials(tiling)
    _normalize_block_rows(_Rows(x_ptr, w_ptr, y_ptr, rows, tiling, partials), block, math)


@cute.kernel
def rms_norm_aot_kernel(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    rows: Int32,
    y_ptr: cute.Pointer,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, partials = _block_and_partials(tiling)
    problem = _Rows(x_ptr, w_ptr, y_ptr, rows, tiling, partials)
    _normalize_rows(problem, block, math, _aligned(math, problem))


@cute.jit
def rms_norm_launcher(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    rows: Int32,
    stream: cuda.CUstream,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
    aot: cutlass.Constexpr = False,
):
    """Host entry of the RMSNorm kernel, or of its AOT kernel."""
    if cutlass.const_expr(aot):
        kernel = rms_norm_aot_kernel(x_ptr, w_ptr, rows, y_ptr, tiling, math)
    else:
        kernel = _rms_norm_kernel(x_ptr, w_ptr, y_ptr, rows, tiling, math)
    _launch_rms_norm(kernel, rows, stream, tiling)


@cute.kernel
def _add_rms_norm_kernel(
    x_ptr: cute.Pointer,
    res_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    h_ptr: cute.Pointer,
    rows: Int32,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, partials = _block_and_partials(tiling)
    _normalize_block_rows(_Rows(x_ptr, w_ptr, y_ptr, rows, tiling, partials, res_ptr, h_ptr), block, math)


@cute.kernel
def add_rms_norm_aot_kernel(
    x_ptr: cute.Pointer,
    res_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    rows: Int32,
    y_ptr: cute.Pointer,
    h_ptr: cute.Pointer,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, partials = _block_and_partials(tiling)
    problem = _Rows(x_ptr, w_ptr, y_ptr, rows, tiling, partials, res_ptr, h_ptr)
    _normalize_rows(problem, block, math, _aligned(math, problem))


@cute.jit
def add_rms_norm_launcher(
    x_ptr: cute.Pointer,
    res_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    h_ptr: cute.Pointer,
    rows: Int32,
    stream: cuda.CUstream,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
    aot: cutlass.Constexpr = False,
):
    """Host entry of the fused residual add+RMSNorm kernel, or of its AOT kernel: the RMSNorm's grid and block."""
    if cutlass.const_expr(aot):
        kernel = add_rms_norm_aot_kernel(x_ptr, res_ptr, w_ptr, rows, y_ptr, h_ptr, tiling, math)
    else:
        kernel = _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, rows, tiling, math)
    _launch_rms_norm(kernel, rows, stream, tiling)


@cute.kernel
def _qk_norm_kernel(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    wq_ptr: cute.Pointer,
    wk_ptr: cute.Pointer,
    q_out_ptr: cute.Pointer,
    k_out_ptr: cute.Pointer,
    q_rows: Int32,
    k_rows: Int32,
    q_blocks: Int32,
    q_tiling: cutlass.Constexpr,
    k_tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, q_partials, k_partials = _block_and_partials(q_tiling, k_tiling)
    q = _Rows(q_ptr, wq_ptr, q_out_ptr, q_rows, q_tiling, q_partials)
    _normalize_q_or_k(block, q_blocks, q, _Rows(k_ptr, wk_ptr, k_out_ptr, k_rows, k_tiling, k_partials), math)


@cute.kernel
def qk_norm_aot_kernel(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    wq_ptr: cute.Pointer,
    wk_ptr: cute.Pointer,
    q_rows: Int32,
    k_rows: Int32,
    q_blocks: Int32,
    q_out_ptr: cute.Pointer,
    k_out_ptr: cute.Pointer,
    q_tiling: cutlass.Constexpr,
    k_tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, q_partials, k_partials = _block_and_partials(q_tiling, k_tiling)
    q = _Rows(q_ptr, wq_ptr, q_out_ptr, q_rows, q_tiling, q_partials)
    k = _Rows(k_ptr, wk_ptr, k_out_ptr, k_rows, k_tiling, k_partials)
    _normalize_q_or_k(block, q_blocks, q, k, math, _aligned(_part_maths(math)[0], q, k))


@cute.jit
def qk_norm_launcher(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    wq_ptr: cute.Pointer,
    wk_ptr: cute.Pointer,
    q_out_ptr: cute.Pointer,
    k_out_ptr: cute.Pointer,
    q_rows: Int32,
    k_rows: Int32,
    stream: cuda.CUstream,
    q_tiling: cutlass.Constexpr,
    k_tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
    aot: cutlass.Constexpr = False,
):
    """Host entry of the QK-norm kernel, or of its AOT kernel: q blocks first, then k blocks, in one grid of the
    block size both tilings share (api.qk_norm_tilings gives them one)."""
    inputs, outputs, q_blocks = (q_ptr, k_ptr, wq_ptr, wk_ptr), (q_out_ptr, k_out_ptr), _blocks(q_rows, q_tiling)
    if cutlass.const_expr(aot):
        kernel = qk_norm_aot_kernel(*inputs, q_rows, k_rows, q_blocks, *outputs, q_tiling, k_tiling, math)
    else:
        kernel = _qk_norm_kernel(*inputs, *outputs, q_rows, k_rows, q_blocks, q_tiling, k_tiling, math)
    kernel.launch(
        grid=[cutlass.max(q_blocks + _blocks(k_rows, k_tiling), 1), 1, 1],
        block=[q_tiling.block_threads, 1, 1],
        smem=smem_bytes(q_tiling) + smem_bytes(k_tiling),
        stream=stream,
    )


@cute.kernel
def qk_norm_rope_kernel(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    wq_ptr: cute.Pointer,
    wk_ptr: cute.Pointer,
    cos_ptr: cute.Pointer,
    sin_ptr: cute.Pointer,
    q_rows: Int32,
    k_rows: Int32,
    batch: Int32,
    seq_len: Int32,
    cos_batch: Int32,
    q_rows_per_token: Int32,
    k_rows_per_token: Int32,
    q_token_magic: Int32,
    k_token_magic: Int32,
    q_blocks: Int32,
    q_out_ptr: cute.Pointer,
    k_out_ptr: cute.Pointer,
    q_tiling: cutlass.Constexpr,
    k_tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
    rope: cutlass.Constexpr,
):
    """QK-norm + rotary embedding, in TensorRT's parameter order (the JIT launches this AOT kernel too): pointers
    promised element alignment, the 16-byte path taken where they all allow it (`_aligned`), else the element path."""
    block, q_partials, k_partials = _block_and_partials(q_tiling, k_tiling)
    shapes = (cos_ptr, sin_ptr, batch, seq_len, cos_batch)
    q_rotation = _Rotation(*shapes, q_rows, q_rows_per_token, q_token_magic, rope.params, rope.plans[0])
    k_rotation = _Rotation(*shapes, k_rows, k_rows_per_token, k_token_magic, rope.params, rope.plans[1])
    q = _Rows(q_ptr, wq_ptr, q_out_ptr, q_rows, q_tiling, q_partials, rotation=q_rotation)
    k = _Rows(k_ptr, wk_ptr, k_out_ptr, k_rows, k_tiling, k_partials, rotation=k_rotation)
    _normalize_q_or_k(block, q_blocks, q, k, math, _aligned(_part_maths(math)[0], q, k))


@cute.jit
def qk_norm_rope_launcher(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    wq_ptr: cute.Pointer,
    wk_ptr: cute.Pointer,
    cos_ptr: cute.Pointer,
    sin_ptr: cute.Pointer,
    q_out_ptr: cute.Pointer,
    k_out_ptr: cute.Pointer,
    q_rows: Int32,
    k_rows: Int32,
    batch: Int32,
    seq_len: Int32,
    cos_batch: Int32,
    stream: cuda.CUstream,
    q_tiling: cutlass.Constexpr,
    k_tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
    rope: cutlass.Constexpr,
    aot: cutlass.Constexpr = False,
):
    """Host entry of the QK-norm + rotary kernel: QK-norm's grid (q blocks, then k blocks). One kernel serves the
    JIT and AOT compiles (`aot`, the other launchers' flag, changes nothing): it tests its pointers' alignment
    itself."""
    q_blocks = _blocks(q_rows, q_tiling)
    inputs, outputs = (q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr), (q_out_ptr, k_out_ptr)
    # Rows per token and their multipliers, here on the host as the AOT declaration computes them
    # (`LaunchDeclaration.launch_values`).
    tokens = cutlass.max(batch * seq_len, 1)
    per_token = (q_rows // tokens, k_rows // tokens)
    magic = tuple((n + (TOKEN_MAGIC_NUMERATOR - 1)) // cutlass.max(n, 1) for n in per_token)
    scalars = (q_rows, k_rows, batch, seq_len, cos_batch, *per_token, *magic, q_blocks)
    kernel = qk_norm_rope_kernel(*inputs, *scalars, *outputs, q_tiling, k_tiling, math, rope)
    kernel.launch(
        grid=[cutlass.max(q_blocks + _blocks(k_rows, k_tiling), 1), 1, 1],
        block=[q_tiling.block_threads, 1, 1],
        smem=smem_bytes(q_tiling) + smem_bytes(k_tiling),
        stream=stream,
    )
