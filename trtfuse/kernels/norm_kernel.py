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

CUTLASS_DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@dataclass(frozen=True)
class NormMath:
    """The compile-time constants of the formula: folded into the kernel as immediates and branches."""

    epsilon: float
    weight_offset: float
    weight_mode: WeightMode


def smem_bytes(tiling: RowTiling) -> int:
    """One fp32 partial sum per warp of each row; allocated always (a few bytes), read only when a row spans warps."""
    return 4 * tiling.rows_per_block * tiling.warps_per_row


@cute.jit
def _copy_if_in_row(src: cute.Tensor, dst: cute.Tensor, vector_index: Int32, vectors: cutlass.Constexpr):
    """Copy one vector unless it lies past the end of the row (the ragged last slot)."""
    if vector_index < vectors:
        cute.autovec_copy(src, dst)


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
    # Only the last vector slot of a thread can fall past the row end (when threads do not divide the row): that
    # slot alone is predicated, and zeroed first so it adds nothing to the sum of squares.
    full_slots = vectors // threads

    tidx, _, _ = cute.arch.thread_idx()
    lane = tidx % threads
    row_in_block = tidx // threads
    row = block * tiling.rows_per_block + row_in_block
    row_ok = row < rows

    # (vector, vector index) views of one row: mode 0 is contiguous, so each column is one 16-byte access.
    row_layout = cute.make_layout((vec, vectors), stride=(1, vec))
    frag_layout = cute.make_layout((vec, per_thread), stride=(1, vec))
    # 64-bit row offset: rows·hidden overflows 32 bits for long prefill batches of wide rows.
    offset = Int64(row) * tiling.hidden
    g_x = cute.make_tensor(x_ptr + offset, row_layout)
    g_y = cute.make_tensor(y_ptr + offset, row_layout)
    r_x = cute.make_rmem_tensor(frag_layout, x_ptr.dtype)
    r_y = cute.make_rmem_tensor(frag_layout, y_ptr.dtype)
    has_weight = math.weight_mode != WeightMode.NONE
    if cutlass.const_expr(has_weight):
        g_w = cute.make_tensor(w_ptr, row_layout)
        r_w = cute.make_rmem_tensor(frag_layout, w_ptr.dtype)

    if cutlass.const_expr(full_slots < per_thread):
        r_x[None, full_slots].fill(0)
    if row_ok:
        for k in cutlass.range_constexpr(full_slots):
            cute.autovec_copy(g_x[None, lane + k * threads], r_x[None, k])
            if cutlass.const_expr(has_weight):
                cute.autovec_copy(g_w[None, lane + k * threads], r_w[None, k])
        if cutlass.const_expr(full_slots < per_thread):
            last = lane + full_slots * threads
            _copy_if_in_row(g_x[None, last], r_x[None, full_slots], last, vectors)
            if cutlass.const_expr(has_weight):
                _copy_if_in_row(g_w[None, last], r_w[None, full_slots], last, vectors)

    x = r_x.load().to(Float32)
    sum_sq = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    sum_sq = cute.arch.warp_reduction(sum_sq, lambda a, b: a + b, threads_in_group=min(threads, WARP))
    if cutlass.const_expr(tiling.warps_per_row > 1):
        warp_in_row = lane // WARP
        if lane % WARP == 0:
            partials[row_in_block, warp_in_row] = sum_sq
        cute.arch.barrier()
        sum_sq = Float32(0.0)
        for w in cutlass.range_constexpr(tiling.warps_per_row):
            sum_sq = sum_sq + partials[row_in_block, w]
    rstd = cute.math.rsqrt(sum_sq / Float32(tiling.hidden) + Float32(math.epsilon), fastmath=True)

    out_dtype = y_ptr.dtype
    if cutlass.const_expr(not has_weight):
        r_y.store((x * rstd).to(out_dtype))
    else:
        w = r_w.load().to(Float32)
        if cutlass.const_expr(math.weight_offset != 0.0):
            w = w + Float32(math.weight_offset)
        if cutlass.const_expr(math.weight_mode == WeightMode.AFTER_CAST):
            r_y.store(((x * rstd).to(out_dtype).to(Float32) * w).to(out_dtype))
        else:
            r_y.store((x * rstd * w).to(out_dtype))

    if row_ok:
        for k in cutlass.range_constexpr(full_slots):
            cute.autovec_copy(r_y[None, k], g_y[None, lane + k * threads])
        if cutlass.const_expr(full_slots < per_thread):
            last = lane + full_slots * threads
            _copy_if_in_row(r_y[None, full_slots], g_y[None, last], last, vectors)


def _partials_layout(tiling: RowTiling) -> cute.Layout:
    return cute.make_layout((tiling.rows_per_block, tiling.warps_per_row), stride=(tiling.warps_per_row, 1))


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
    blocks = cutlass.max((rows + tiling.rows_per_block - 1) // tiling.rows_per_block, 1)
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
    q_blocks = (q_rows + q_tiling.rows_per_block - 1) // q_tiling.rows_per_block
    k_blocks = (k_rows + k_tiling.rows_per_block - 1) // k_tiling.rows_per_block
    _qk_norm_kernel(
        q_ptr, k_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr, q_rows, k_rows, q_blocks, q_tiling, k_tiling, math
    ).launch(
        grid=[cutlass.max(q_blocks + k_blocks, 1), 1, 1],
        block=[q_tiling.block_threads, 1, 1],
        smem=smem_bytes(q_tiling) + smem_bytes(k_tiling),
        stream=stream,
    )
