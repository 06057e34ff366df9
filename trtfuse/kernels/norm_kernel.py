"""CuTeDSL RMSNorm and QK-norm kernels: one register-resident pass over each row, compile-time specialised.

A row's `threads_per_row` threads each hold `vectors_per_thread` vectors of the row (x and weight) in registers, so x
is read once and y written once. The sum of squares is reduced in fp32 with butterfly shuffles inside the row's
lanes; a row wider than a warp adds one shared-memory exchange between its warps. QK-norm runs two such problems in
one grid: the first blocks take q rows, the rest k rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from trtfuse.contract import WeightMode
from trtfuse.kernels.tiling import WARP, RowTiling

# L1 eviction priorities: x and y are touched once (streamed); the weight is re-read by every row.
STREAM_POLICY = cute.nvgpu.CacheEvictionPriority.EVICT_NORMAL
WEIGHT_POLICY = cute.nvgpu.CacheEvictionPriority.EVICT_NORMAL

CUTLASS_DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@dataclass(frozen=True)
class NormMath:
    """The compile-time constants of the formula: folded into the kernel as immediates and branches."""

    epsilon: float
    weight_offset: float
    weight_mode: WeightMode


def smem_bytes(tiling: RowTiling) -> int:
    """One fp32 partial sum per warp of each row; allocated always (a few bytes), read only when a row spans warps."""
    return 4 * tiling.rows_per_thread * tiling.rows_per_block * tiling.warps_per_row


@cute.jit
def _copy_if_in_row(
    src: cute.Tensor, dst: cute.Tensor, vector_index: Int32, vectors: cutlass.Constexpr, policy: cutlass.Constexpr
):
    """Copy one vector unless it lies past the end of the row (the ragged last slot)."""
    if vector_index < vectors:
        cute.autovec_copy(src, dst, l1c_evict_priority=policy)


@cute.jit
def _normalize_block_rows(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    rows: Int32,
    block: Int32,
    partials: cute.Tensor,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    """Normalise the rows of block number `block` (of this problem); every thread of the block must call this."""
    vec = tiling.vector
    threads = tiling.threads_per_row
    per_thread = tiling.vectors_per_thread
    vectors = tiling.vectors_per_row
    passes = tiling.rows_per_thread
    # Only the last vector slot of a thread can fall past the row end (when threads do not divide the row): that
    # slot alone is predicated, and zeroed first so it adds nothing to the sum of squares.
    full_slots = vectors // threads
    ragged = full_slots < per_thread
    has_weight = math.weight_mode != WeightMode.NONE

    tidx, _, _ = cute.arch.thread_idx()
    lane = tidx % threads
    row_in_block = tidx // threads
    # A block owns rows_per_block * rows_per_thread consecutive rows; pass p of a thread group takes every
    # rows_per_block-th of them, so each pass of the block still reads one contiguous stretch.
    first_row = block * (tiling.rows_per_block * passes) + row_in_block

    # (vector, vector index) view of one row: mode 0 is contiguous, so each column is one 16-byte access.
    row_layout = cute.make_layout((vec, vectors), stride=(1, vec))
    # Registers: (vector, slot, pass); every pass's x is loaded before any reduction, for more bytes in flight.
    frag_layout = cute.make_layout((vec, per_thread, passes), stride=(1, vec, vec * per_thread))
    r_x = cute.make_rmem_tensor(frag_layout, x_ptr.dtype)
    r_y = cute.make_rmem_tensor(frag_layout, y_ptr.dtype)

    if cutlass.const_expr(has_weight):
        # The weight is the same for every row: loaded once per thread, kept in L2 while x and y stream past.
        g_w = cute.make_tensor(w_ptr, row_layout)
        r_w = cute.make_rmem_tensor(cute.make_layout((vec, per_thread), stride=(1, vec)), w_ptr.dtype)
        if first_row < rows:
            for k in cutlass.range_constexpr(full_slots):
                cute.autovec_copy(g_w[None, lane + k * threads], r_w[None, k], l1c_evict_priority=WEIGHT_POLICY)
            if cutlass.const_expr(ragged):
                last = lane + full_slots * threads
                _copy_if_in_row(g_w[None, last], r_w[None, full_slots], last, vectors, WEIGHT_POLICY)

    for p in cutlass.range_constexpr(passes):
        row = first_row + p * tiling.rows_per_block
        if cutlass.const_expr(ragged):
            r_x[None, full_slots, p].fill(0)
        if row < rows:
            # 64-bit row offset: rows·hidden overflows 32 bits for long prefill batches of wide rows.
            g_x = cute.make_tensor(x_ptr + Int64(row) * tiling.hidden, row_layout)
            for k in cutlass.range_constexpr(full_slots):
                cute.autovec_copy(g_x[None, lane + k * threads], r_x[None, k, p], l1c_evict_priority=STREAM_POLICY)
            if cutlass.const_expr(ragged):
                last = lane + full_slots * threads
                _copy_if_in_row(g_x[None, last], r_x[None, full_slots, p], last, vectors, STREAM_POLICY)

    sums = []
    for p in cutlass.range_constexpr(passes):
        x = r_x[None, None, p].load().to(Float32)
        sum_sq = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        sums.append(cute.arch.warp_reduction(sum_sq, lambda a, b: a + b, threads_in_group=min(threads, WARP)))
    if cutlass.const_expr(tiling.warps_per_row > 1):
        # A row spans several warps: one shared-memory exchange of per-warp sums, one barrier for all passes.
        if lane % WARP == 0:
            for p in cutlass.range_constexpr(passes):
                partials[p, row_in_block, lane // WARP] = sums[p]
        cute.arch.barrier()
        for p in cutlass.range_constexpr(passes):
            total = Float32(0.0)
            for w in cutlass.range_constexpr(tiling.warps_per_row):
                total = total + partials[p, row_in_block, w]
            sums[p] = total

    out_dtype = y_ptr.dtype
    if cutlass.const_expr(has_weight):
        w = r_w.load().to(Float32)
        if cutlass.const_expr(math.weight_offset != 0.0):
            w = w + Float32(math.weight_offset)
    for p in cutlass.range_constexpr(passes):
        rstd = cute.math.rsqrt(sums[p] / Float32(tiling.hidden) + Float32(math.epsilon), fastmath=True)
        x = r_x[None, None, p].load().to(Float32)
        if cutlass.const_expr(not has_weight):
            r_y[None, None, p].store((x * rstd).to(out_dtype))
        elif cutlass.const_expr(math.weight_mode == WeightMode.AFTER_CAST):
            r_y[None, None, p].store(((x * rstd).to(out_dtype).to(Float32) * w).to(out_dtype))
        else:
            r_y[None, None, p].store((x * rstd * w).to(out_dtype))

    for p in cutlass.range_constexpr(passes):
        row = first_row + p * tiling.rows_per_block
        if row < rows:
            g_y = cute.make_tensor(y_ptr + Int64(row) * tiling.hidden, row_layout)
            for k in cutlass.range_constexpr(full_slots):
                cute.autovec_copy(r_y[None, k, p], g_y[None, lane + k * threads], l1c_evict_priority=STREAM_POLICY)
            if cutlass.const_expr(ragged):
                last = lane + full_slots * threads
                _copy_if_in_row(r_y[None, full_slots, p], g_y[None, last], last, vectors, STREAM_POLICY)


def _partials_layout(tiling: RowTiling) -> cute.Layout:
    return cute.make_layout((tiling.rows_per_thread, tiling.rows_per_block, tiling.warps_per_row))


@cute.kernel
def _rms_norm_kernel(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    rows: Int32,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    block, _, _ = cute.arch.block_idx()
    smem = cutlass.memory.SmemAllocator()
    partials = smem.allocate_tensor(Float32, _partials_layout(tiling), byte_alignment=4)
    _normalize_block_rows(x_ptr, w_ptr, y_ptr, rows, block, partials, tiling, math)


@cute.jit
def rms_norm_launcher(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    y_ptr: cute.Pointer,
    rows: Int32,
    stream: cuda.CUstream,
    tiling: cutlass.Constexpr,
    math: cutlass.Constexpr,
):
    """Host entry: one block per `rows_per_block` rows; at least one block, so a 0-row call is a valid no-op."""
    per_block = tiling.rows_per_block * tiling.rows_per_thread
    blocks = cutlass.max((rows + per_block - 1) // per_block, 1)
    _rms_norm_kernel(x_ptr, w_ptr, y_ptr, rows, tiling, math).launch(
        grid=[blocks, 1, 1],
        block=[tiling.block_threads, 1, 1],
        smem=smem_bytes(tiling),
        stream=stream,
    )


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
    block, _, _ = cute.arch.block_idx()
    smem = cutlass.memory.SmemAllocator()
    q_partials = smem.allocate_tensor(Float32, _partials_layout(q_tiling), byte_alignment=4)
    k_partials = smem.allocate_tensor(Float32, _partials_layout(k_tiling), byte_alignment=4)
    # The branch is uniform per block, so the barrier of a multi-warp row stays inside one side.
    if block < q_blocks:
        _normalize_block_rows(q_ptr, wq_ptr, q_out_ptr, q_rows, block, q_partials, q_tiling, math)
    else:
        _normalize_block_rows(k_ptr, wk_ptr, k_out_ptr, k_rows, block - q_blocks, k_partials, k_tiling, math)


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
):
    """Host entry: q blocks first, then k blocks, in one grid."""
    q_per_block = q_tiling.rows_per_block * q_tiling.rows_per_thread
    k_per_block = k_tiling.rows_per_block * k_tiling.rows_per_thread
    q_blocks = (q_rows + q_per_block - 1) // q_per_block
    k_blocks = (k_rows + k_per_block - 1) // k_per_block
    _qk_norm_kernel(
        q_ptr, k_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr, q_rows, k_rows, q_blocks, q_tiling, k_tiling, math
    ).launch(
        grid=[cutlass.max(q_blocks + k_blocks, 1), 1, 1],
        block=[q_tiling.block_threads, 1, 1],
        smem=smem_bytes(q_tiling) + smem_bytes(k_tiling),
        stream=stream,
    )
