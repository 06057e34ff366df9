"""Host-side launch configuration: how a row of `hidden` elements is spread over threads, and which variant runs.

Every kernel here reads a row once from DRAM: each thread loads `vectors_per_thread` vectors of `vector` elements
(16 bytes when the pointers allow it), the row's threads reduce the sum of squares (butterfly shuffles, plus one
shared-memory exchange when a row spans several warps), and each thread writes its vectors once. Between the
reduction and the store x is held in registers (decode, head-dim rows, narrow vectors) or read again from the
caches (prefill).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

ACCESS_BYTES = 16  # the widest global access a thread can issue (ld.global.v4.b32)
WARP = 32
MAX_BLOCK_THREADS = 1024  # CUDA's limit; rows wider than 1024 threads' worth give each thread more vectors
PREFILL_BLOCK_THREADS = 128  # blocks of at least 4 warps: rows narrower than that share a block
# The H200 measurements behind the constants below: docs/performance.md, "The tiling table's constants".
SMALL_ROW_VECTORS = 32  # rows of at most one warp of vectors take one vector per lane
PREFILL_VECTORS_PER_THREAD = 2
PREFILL_MAX_ROW_THREADS = 256  # wider prefill rows give each thread more vectors
PREFILL_RESIDENT_THREADS = 1536  # 256 x 2-vector prefill rows fit 6 blocks per SM: a 40-register cap
DECODE_VECTORS_PER_THREAD = 4


@dataclass(frozen=True)
class GpuTable:
    """The table's choices that differ between GPUs of one architecture, each measured on the part it names
    (docs/performance.md, "One table per GPU"). Only 16-bit rows of one dtype (x and y alike) take them: the others
    were measured on the H200 alone."""

    name: str
    # A plain (no residual) prefill row reads x twice from this many threads per row.
    reread_min_threads: int
    # An add+norm prefill row spreads over at most this many threads (2 vectors each).
    residual_max_row_threads: int


H200_TABLE = GpuTable("H200", reread_min_threads=PREFILL_BLOCK_THREADS, residual_max_row_threads=256)
# The H100 (HBM3, 3.35 TB/s against the H200's 4.8): 16384x2048 bf16/fp16 RMSNorm 47.1-47.6 µs with x held in
# registers against 48.3-48.7 read twice; add+norm 8192x8192 180.5 µs in 512 threads x 2 vectors against 183.6 in
# 256 x 4 (the same run, 2026-12-07).
H100_TABLE = GpuTable("H100", reread_min_threads=2 * PREFILL_BLOCK_THREADS, residual_max_row_threads=512)


def gpu_table(device_name: str) -> GpuTable:
    """The table of the GPU named `device_name` (the driver's name, e.g. "NVIDIA H100 80GB HBM3"): the H100's for an
    H100, the H200's (where the table was first measured) for every other GPU and for compiling without one."""
    return H100_TABLE if "H100" in device_name else H200_TABLE


class Regime(enum.Enum):
    """Few rows (decode: spread rows over the SMs, one row per block) or many rows (prefill: pack rows into blocks)."""

    DECODE = "decode"
    PREFILL = "prefill"


@dataclass(frozen=True)
class RowTiling:
    """How one row of `hidden` elements maps onto threads; every field is a compile-time constant of the kernel."""

    hidden: int
    vector: int  # elements per access
    threads_per_row: int  # a power of two; below 32 a row is part of a warp, above it several warps
    vectors_per_thread: int
    rows_per_block: int
    # At least this many blocks must fit on one SM (ptxas caps the registers per thread to allow it); 0: no floor.
    min_blocks_per_sm: int = 0
    # x is loaded twice, 16 bytes per access: evict-last (L1 and L2) for the sum of squares, evict-first for the
    # output, instead of held in registers across the reduction. Needs 16-byte vectors (`ptx.load_16_bytes`).
    reread: bool = False
    # y's vectors are 32 bytes (a 16-bit x with an fp32 y): neighbouring lanes swap halves with one shuffle per word,
    # so that each 16-byte store instruction writes whole 32-byte sectors (lane pairs fill one sector each).
    paired_stores: bool = False

    @property
    def vectors_per_row(self) -> int:
        return self.hidden // self.vector

    @property
    def block_threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // WARP)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def full_vector(hidden: int, elem_bytes: int) -> int:
    """The widest vector (elements) that divides the row, so every row starts as aligned as the tensor does."""
    vector = ACCESS_BYTES // elem_bytes
    while hidden % vector:
        vector //= 2
    return vector


def access_vector(hidden: int, x_bytes: int, y_bytes: int) -> int:
    """Elements per access: 16 bytes of the narrower of x and y, halved until the vector divides the row.

    With one dtype on both sides this is `full_vector`. With an fp32 x and a 16-bit y (or the reverse) it is 8
    elements: the 16-bit side moves a vector in one 16-byte access, the fp32 side in two, so both sides keep
    16-byte accesses (4 elements, as for fp32 alone, would leave the 16-bit side at 8 bytes).
    """
    return full_vector(hidden, min(x_bytes, y_bytes))


def regime_for(rows: int, sm_count: int) -> Regime:
    """Decode while one row per block still leaves SMs idle or just fills them; prefill packs rows beyond that."""
    return Regime.DECODE if rows <= sm_count else Regime.PREFILL


def row_tiling(
    hidden: int,
    vector: int,
    regime: Regime,
    x_bytes: int = 2,
    y_bytes: int | None = None,
    residual: bool = False,
    table: GpuTable = H200_TABLE,
) -> RowTiling:
    """The table: threads per row from the vectors each thread should hold; rows per block from the block size.

    - rows of at most one warp of vectors (attention heads): one vector per lane, part of a warp per row, reduced
      by butterfly shuffles alone; 128-thread blocks. The same in both regimes, since many heads per token already
      fill the SMs in decode.
    - prefill: 2 vectors per thread, so a row spans several warps (more warps in flight, lighter threads), up to
      256 threads per row; blocks of at least 128 threads, one row per block from 256 vectors up. Rows of exactly
      256 threads x 2 vectors must fit 6 blocks per SM (a register cap of 40). A 16-bit x (`x_bytes` is x's
      element size) in 16-byte vectors is read twice when its row takes 128 threads or more.
    - decode: 4 vectors per thread, one row per block, so the few rows land on distinct SMs while each row's
      per-thread work (the latency of a lone row) stays short.
    - rows whose y (`y_bytes`, default x's) differs from x in width: the same, without the register cap.
    - a 1-byte y (FP8, INT8): 16-element vectors, twice a 16-bit row's. Prefill keeps 2 vectors per thread (half
      the threads of a 16-bit row: fewer, longer threads hide the quantizer's division better); decode takes 1 (a
      lone row's division spread over twice the threads); with a residual, prefill takes 1.
    - `residual` (the add+norm kernel: a residual row read and h written beside x and y): the same table without
      the register cap. A thread also holds the residual's slots; at 40 registers ptxas spills 8-16 bytes for
      BEFORE_CAST and for an fp32 weight, and Llama's 16-bit rows stay at 39-40 registers uncapped.
    - `table`: the GPU's own choices for 16-bit rows of one dtype (`GpuTable`): from how many threads a plain row
      is read twice, and up to how many threads an add+norm row spreads.
    """
    vectors = hidden // vector
    min_blocks = 0
    reread = False
    mixed = y_bytes is not None and y_bytes != x_bytes
    # A 1-byte y's share of vectors per thread, against a 16-bit row's (measured: docs/performance.md,
    # "Quantized norms").
    one_byte = y_bytes == 1
    prefill_per_thread = 1 if one_byte and residual else PREFILL_VECTORS_PER_THREAD
    decode_per_thread = 1 if one_byte else DECODE_VECTORS_PER_THREAD
    if vectors <= SMALL_ROW_VECTORS:
        threads = _next_pow2(vectors)
        per_block = PREFILL_BLOCK_THREADS
    elif regime is Regime.PREFILL:
        per_thread = prefill_per_thread
        sixteen_bit = x_bytes == 2 and not mixed
        max_threads = table.residual_max_row_threads if residual and sixteen_bit else PREFILL_MAX_ROW_THREADS
        threads = min(max_threads, _next_pow2(-(-vectors // per_thread)))
        per_block = max(PREFILL_BLOCK_THREADS, threads)
        if vectors == PREFILL_MAX_ROW_THREADS * PREFILL_VECTORS_PER_THREAD and not mixed and not residual:
            min_blocks = PREFILL_RESIDENT_THREADS // per_block
        # Measured for fp16/bf16 rows of 128 threads or more (H >= 2048) only.
        reread_from = table.reread_min_threads if sixteen_bit and not residual else PREFILL_BLOCK_THREADS
        reread = x_bytes == 2 and vector * x_bytes == ACCESS_BYTES and threads >= reread_from
    else:
        per_thread = decode_per_thread
        threads = min(MAX_BLOCK_THREADS, max(WARP, _next_pow2(-(-vectors // per_thread))))
        per_block = threads
    return RowTiling(
        hidden=hidden,
        vector=vector,
        threads_per_row=threads,
        vectors_per_thread=-(-vectors // threads),
        rows_per_block=max(1, per_block // threads),
        min_blocks_per_sm=min_blocks,
        reread=reread,
        paired_stores=y_bytes is not None and vector * y_bytes == 2 * ACCESS_BYTES and threads >= 2,
    )


def with_block_threads(tiling: RowTiling, block_threads: int) -> RowTiling:
    """The same row mapping in a block of `block_threads` threads (QK-norm's two parts share one block size, so
    neither part's residency floor holds)."""
    return dataclasses.replace(tiling, rows_per_block=block_threads // tiling.threads_per_row, min_blocks_per_sm=0)


def rotation_vector(vector: int, head_dim: int, rotary_dim: int, rotation: str) -> int:
    """The vector of a row whose heads are rotated: `vector` halved until it divides the head, and the rotated width
    R (interleaved: whole pairs, so a vector is either all rotated or all passed through) or R/2 (half: a vector's
    partner, R/2 elements away, is then a whole vector too)."""
    span = rotary_dim // 2 if rotation == "half" else rotary_dim
    while head_dim % vector or span % vector:
        vector //= 2
    return vector


@dataclass(frozen=True)
class RotationPlan:
    """Where each rotated vector of a thread finds its partner's values (the rotation's other operand), in the
    registers of its row's threads. Compile-time, from the tiling alone (`rotation_plan`).

    Slot k of lane l holds vector p = l + k·threads_per_row of the row, at position h = p mod head_vectors in its
    head; it is rotated when h < rotary_vectors. Its partner vector (half: h ± rotary_vectors/2; interleaved: p
    itself, the elements swapped in pairs) sits in slot `source_slots[k]` of a lane of the same warp, the same slot
    for every lane whose slot k is rotated, so one shuffle of that slot (or a register read, `shuffles[k]` False,
    where every partner is the lane itself) brings it. None: no lane's slot k is rotated."""

    head_vectors: int
    rotary_vectors: int
    source_slots: tuple[int | None, ...]
    shuffles: tuple[bool, ...]


def rotation_plan(tiling: RowTiling, head_dim: int, rotary_dim: int, rotation: str) -> RotationPlan | None:
    """The register exchange of a rotated row in `tiling`, or None where none exists: a rotated slot whose
    partners sit in different slots of their lanes (no one shuffle serves them), or in another warp, or a vector
    that splits a pair (interleaved rows in 1-element vectors). Such rows take the element path."""
    vector, threads = tiling.vector, tiling.threads_per_row
    if head_dim % vector or rotary_dim % vector or (rotation == "interleaved" and vector % 2):
        return None
    head_vectors, rotary_vectors = head_dim // vector, rotary_dim // vector
    half = rotary_vectors // 2
    if rotation == "half" and half * 2 * vector != rotary_dim:
        return None
    source_slots: list[int | None] = []
    shuffles: list[bool] = []
    for slot in range(tiling.vectors_per_thread):
        sources: set[int] = set()
        shuffle = False
        for lane in range(threads):
            vector_index = lane + slot * threads
            position = vector_index % head_vectors
            if vector_index >= tiling.vectors_per_row or position >= rotary_vectors:
                continue
            partner = vector_index
            if rotation == "half":
                partner += half if position < half else -half
            partner_lane = partner % threads
            if partner_lane // WARP != lane // WARP:
                return None
            sources.add(partner // threads)
            shuffle = shuffle or partner_lane != lane
        if len(sources) > 1:
            return None
        source_slots.append(sources.pop() if sources else None)
        shuffles.append(shuffle)
    return RotationPlan(head_vectors, rotary_vectors, tuple(source_slots), tuple(shuffles))
