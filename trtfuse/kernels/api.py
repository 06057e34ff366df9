"""The kernel objects the plugins call: variant choice per call, warm-up, raw-pointer launch, torch convenience."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from trtfuse.contract import WeightMode
from trtfuse.contract.rotary_shapes import attention_dims
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import AddRmsNormVariant, QkNormRopeVariant, QkNormVariant, RmsNormVariant
from trtfuse.kernels.device import DeviceInfo, current_device
from trtfuse.kernels.specs import DTYPE_BYTES, AddRmsNormSpec, QkNormRopeSpec, QkNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import (
    ACCESS_BYTES,
    H200_TABLE,
    GpuTable,
    Regime,
    RowTiling,
    access_vector,
    gpu_table,
    regime_for,
    rotation_vector,
    row_tiling,
    with_block_threads,
)

if TYPE_CHECKING:
    import torch

_shared_cache: KernelCache | None = None
_kernels: dict[RmsNormSpec | AddRmsNormSpec | QkNormSpec, _Kernel] = {}
_kernels_lock = threading.Lock()


def shared_cache() -> KernelCache:
    """The process-wide compile cache (on-disk root from TRTFUSE_KERNEL_CACHE or ~/.cache/trtfuse/kernels)."""
    global _shared_cache
    if _shared_cache is None:
        _shared_cache = KernelCache()
    return _shared_cache


def _vector(hidden: int, dtype: str, out_dtype: str) -> int:
    return access_vector(hidden, DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype])


def rms_norm_tiling(
    spec: RmsNormSpec | AddRmsNormSpec, regime: Regime, aligned: bool, table: GpuTable = H200_TABLE
) -> RowTiling:
    """The row tiling of `spec` in `regime` on a GPU of `table`: full vectors for aligned pointers, one element per
    access otherwise. An add+norm spec's rows carry the residual's extra read and h's write (`row_tiling`'s
    `residual`)."""
    vector = _vector(spec.hidden, spec.dtype, spec.y_dtype) if aligned else 1
    x_bytes, y_bytes = DTYPE_BYTES[spec.dtype], DTYPE_BYTES[spec.y_dtype]
    residual = isinstance(spec, AddRmsNormSpec)
    return row_tiling(spec.hidden, vector, regime, x_bytes, y_bytes, residual=residual, table=table)


def qk_norm_tilings(spec: QkNormSpec, aligned: bool) -> tuple[RowTiling, RowTiling]:
    """q's and k's tilings in one block size; head-dim rows use the small-row table entry, wide rows the prefill one
    (the same in both regimes for head-dim rows, so QK-norm has one tiling whatever the row count). A rotated
    spec's (`QkNormRopeSpec`) vector also divides its heads and its rotated width (`tiling.rotation_vector`)."""
    x_bytes = DTYPE_BYTES[spec.dtype]

    def tiling(hidden: int, part: int) -> RowTiling:
        y_dtype = spec.part_y_dtype(part)
        vector = _vector(hidden, spec.dtype, y_dtype) if aligned else 1
        if isinstance(spec, QkNormRopeSpec):
            vector = rotation_vector(vector, spec.rope.head_dim, spec.rope.rotary_dim, spec.rope.rotation)
        tiling = row_tiling(hidden, vector, Regime.PREFILL, x_bytes, DTYPE_BYTES[y_dtype])
        if isinstance(spec, QkNormRopeSpec) and spec.rope.moves_heads and hidden > spec.rope.head_dim:
            # A lane pair's two stores address the row as one run, which its heads, S·D elements apart, are not.
            tiling = dataclasses.replace(tiling, paired_stores=False)
        return tiling

    q, k = tiling(spec.q_hidden, 0), tiling(spec.k_hidden, 1)
    block = max(q.block_threads, k.block_threads)
    return with_block_threads(q, block), with_block_threads(k, block)


def _alignment_masks(hidden: int, dtype: str, out_dtype: str, weight_dtype: str | None) -> tuple[int, int]:
    """Low-bit masks a pointer must clear for the full-vector variant: (inputs and outputs, weight). One mask for x
    and y: the stricter of the two sides' (the same when they share a dtype)."""
    vector = _vector(hidden, dtype, out_dtype)

    def mask(name: str) -> int:
        return min(ACCESS_BYTES, vector * DTYPE_BYTES[name]) - 1

    return max(mask(dtype), mask(out_dtype)), mask(weight_dtype or dtype)


# torch's names where they differ from the contract's.
_TORCH_NAMES = {"float8_e4m3fn": "float8_e4m3fn"}


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, _TORCH_NAMES.get(name, name))


def _check_tensor(what: str, t: torch.Tensor, dtype: str, shape: tuple[int, ...]) -> None:
    if not t.is_cuda or not t.is_contiguous():
        raise ValueError(f"{what} must be a contiguous CUDA tensor")
    if t.dtype != _torch_dtype(dtype):
        raise ValueError(f"{what} has dtype {t.dtype}, expected {dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {shape}")


def _check_activation(what: str, t: torch.Tensor, dtype: str, hidden: int) -> None:
    if t.dim() == 0 or t.shape[-1] != hidden:
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected last dimension {hidden}")
    _check_tensor(what, t, dtype, tuple(t.shape))


def load_into_context(function: Any, n_args: int) -> None:
    """Call with every argument 0 (null pointers, 0 rows, the default stream): a no-op launch of one block, so the
    module load CuTeDSL does on a function's first call happens here, at warm-up, and never in a later launch such
    as one under CUDA-graph capture."""
    function(*([0] * n_args))


def _current_stream() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


def _weight_ptr(spec: RmsNormSpec | AddRmsNormSpec, w: torch.Tensor | None) -> int:
    """`w`'s pointer (0 without a weight), checked to be given exactly when weight_mode is not NONE."""
    if (w is None) != (spec.params.weight_mode is WeightMode.NONE):
        raise ValueError("a weight is required exactly when weight_mode is not NONE")
    if w is None:
        return 0
    _check_tensor("w", w, spec.weight_dtype, (spec.hidden,))
    return w.data_ptr()


def _output(
    what: str, given: torch.Tensor | None, like: torch.Tensor, dtype: str, shape: tuple[int, ...] | None = None
) -> torch.Tensor:
    """`given`, checked to be of `shape` (None: `like`'s) and `dtype`, or a new such tensor on `like`'s device."""
    import torch

    shape = tuple(like.shape) if shape is None else shape
    out = torch.empty(shape, dtype=_torch_dtype(dtype), device=like.device) if given is None else given
    _check_tensor(what, out, dtype, shape)
    return out


class _Kernel:
    """A kernel's compiled variants by key, each compiled or loaded once (`KernelCache`) and, on a GPU, loaded into
    the CUDA context at once (`load_into_context`)."""

    _launch_args: int  # the compiled function's arguments: pointers, row counts, stream

    def __init__(self, spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, cache: KernelCache, device: DeviceInfo) -> None:
        self.spec = spec
        self.cache = cache
        self.device = device
        self._functions: dict[Any, Any] = {}

    def _variant_of(self, key: Any) -> RmsNormVariant | AddRmsNormVariant | QkNormVariant:
        raise NotImplementedError

    def _compiled(self, key: Any) -> Any:
        function = self._functions.get(key)
        if function is None:
            function = self.cache.get(self._variant_of(key))
            if self.device.has_gpu:
                load_into_context(function, n_args=self._launch_args)
            self._functions[key] = function
        return function


class RmsNormKernel(_Kernel):
    """RMSNorm over rows of `spec.hidden`: a decode and a prefill tiling, each with a 16-byte and a scalar variant."""

    _launch_args = 5
    spec: RmsNormSpec

    def __init__(self, spec: RmsNormSpec, cache: KernelCache, device: DeviceInfo) -> None:
        super().__init__(spec, cache, device)
        self._act_mask, self._weight_mask = _alignment_masks(spec.hidden, spec.dtype, spec.y_dtype, spec.weight_dtype)
        self._decode_max_rows = device.sm_count

    def variant(self, regime: Regime, aligned: bool) -> RmsNormVariant:
        tiling = rms_norm_tiling(self.spec, regime, aligned, gpu_table(self.device.name))
        return RmsNormVariant(self.spec, tiling, self.device.arch)

    def _variant_of(self, key: tuple[bool, bool]) -> RmsNormVariant:
        decode, aligned = key
        return self.variant(Regime.DECODE if decode else Regime.PREFILL, aligned)

    def _function(self, decode: bool, aligned: bool) -> Any:
        """The compiled function of the decode or prefill, 16-byte or scalar variant (trtfuse.bench.kernels times
        it without `launch`'s choice)."""
        return self._compiled((decode, aligned))

    def warm_up(self, max_rows: int) -> None:
        """Compile or load every variant a call with 1..max_rows rows and any pointer alignment can pick."""
        regimes = {regime_for(1, self.device.sm_count), regime_for(max(1, max_rows), self.device.sm_count)}
        for regime in regimes:
            for aligned in (True, False):
                self._compiled((regime is Regime.DECODE, aligned))

    def launch(self, x_ptr: int, w_ptr: int, y_ptr: int, rows: int, stream: int) -> None:
        """Enqueue on `stream` (a cudaStream_t as int); `w_ptr` is 0 without a weight. No allocation, no sync."""
        aligned = not ((x_ptr | y_ptr) & self._act_mask or w_ptr & self._weight_mask)
        # regime_for's rule, inlined: this is the per-enqueue path.
        key = (rows <= self._decode_max_rows, aligned)
        function = self._functions.get(key) or self._compiled(key)
        function(x_ptr, w_ptr, y_ptr, rows, stream)

    def __call__(self, x: torch.Tensor, w: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Torch convenience for tests and benchmarks: x [..., hidden] on the current stream; returns `out`."""
        spec = self.spec
        _check_activation("x", x, spec.dtype, spec.hidden)
        w_ptr = _weight_ptr(spec, w)
        out = _output("out", out, x, spec.y_dtype)
        self.launch(x.data_ptr(), w_ptr, out.data_ptr(), x.numel() // spec.hidden, _current_stream())
        return out


class AddRmsNormKernel(RmsNormKernel):
    """h = D(x + residual) and y = RMSNorm(h) in one pass; RMSNorm's variants, regimes and alignment rule, with the
    residual and h held to x's alignment."""

    _launch_args = 7
    spec: AddRmsNormSpec

    def variant(self, regime: Regime, aligned: bool) -> AddRmsNormVariant:
        tiling = rms_norm_tiling(self.spec, regime, aligned, gpu_table(self.device.name))
        return AddRmsNormVariant(self.spec, tiling, self.device.arch)

    def launch(  # type: ignore[override]
        self, x_ptr: int, residual_ptr: int, w_ptr: int, y_ptr: int, h_ptr: int, rows: int, stream: int
    ) -> None:
        """Enqueue on `stream`; `w_ptr` is 0 without a weight; `h_ptr` receives x + residual. No allocation, no
        sync."""
        aligned = not ((x_ptr | residual_ptr | y_ptr | h_ptr) & self._act_mask or w_ptr & self._weight_mask)
        key = (rows <= self._decode_max_rows, aligned)
        function = self._functions.get(key) or self._compiled(key)
        function(x_ptr, residual_ptr, w_ptr, y_ptr, h_ptr, rows, stream)

    def __call__(  # type: ignore[override]
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        w: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        h_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Torch convenience: x and residual [..., hidden] on the current stream; returns (y, h)."""
        spec = self.spec
        _check_activation("x", x, spec.dtype, spec.hidden)
        _check_tensor("residual", residual, spec.dtype, tuple(x.shape))
        w_ptr = _weight_ptr(spec, w)
        out, h_out = _output("out", out, x, spec.y_dtype), _output("h_out", h_out, x, spec.dtype)
        rows = x.numel() // spec.hidden
        self.launch(x.data_ptr(), residual.data_ptr(), w_ptr, out.data_ptr(), h_out.data_ptr(), rows, _current_stream())
        return out, h_out


class QkNormKernel(_Kernel):
    """q rows of `q_hidden` and k rows of `k_hidden`, one launch; a 16-byte and a scalar variant."""

    _launch_args = 9
    spec: QkNormSpec

    def __init__(self, spec: QkNormSpec, cache: KernelCache, device: DeviceInfo) -> None:
        super().__init__(spec, cache, device)
        self._q_masks = _alignment_masks(spec.q_hidden, spec.dtype, spec.part_y_dtype(0), spec.weight_dtype)
        self._k_masks = _alignment_masks(spec.k_hidden, spec.dtype, spec.part_y_dtype(1), spec.weight_dtype)

    def variant(self, aligned: bool) -> QkNormVariant:
        q, k = qk_norm_tilings(self.spec, aligned)
        return QkNormVariant(self.spec, q, k, self.device.arch)

    def _variant_of(self, key: bool) -> QkNormVariant:
        return self.variant(key)

    def warm_up(self, max_rows: int) -> None:
        """Compile or load both alignment variants (the tiling does not depend on the row count)."""
        del max_rows
        for aligned in (True, False):
            self._compiled(aligned)

    def launch(
        self,
        q_ptr: int,
        k_ptr: int,
        wq_ptr: int,
        wk_ptr: int,
        q_out_ptr: int,
        k_out_ptr: int,
        q_rows: int,
        k_rows: int,
        stream: int,
    ) -> None:
        """Enqueue both norms on `stream`; weight pointers are 0 without weights. No allocation, no sync."""
        q_act, q_w = self._q_masks
        k_act, k_w = self._k_masks
        aligned = not ((q_ptr | q_out_ptr) & q_act or (k_ptr | k_out_ptr) & k_act or wq_ptr & q_w or wk_ptr & k_w)
        function = self._functions.get(aligned) or self._compiled(aligned)
        function(q_ptr, k_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr, q_rows, k_rows, stream)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        wq: torch.Tensor | None = None,
        wk: torch.Tensor | None = None,
        q_out: torch.Tensor | None = None,
        k_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Torch convenience: q [..., q_hidden], k [..., k_hidden] on the current stream; returns (q_out, k_out)."""
        spec = self.spec
        _check_activation("q", q, spec.dtype, spec.q_hidden)
        _check_activation("k", k, spec.dtype, spec.k_hidden)
        q_out, k_out = _qk_weights_and_outputs(spec, q, k, wq, wk, q_out, k_out)
        self.launch(
            q.data_ptr(),
            k.data_ptr(),
            0 if wq is None else wq.data_ptr(),
            0 if wk is None else wk.data_ptr(),
            q_out.data_ptr(),
            k_out.data_ptr(),
            q.numel() // spec.q_hidden,
            k.numel() // spec.k_hidden,
            _current_stream(),
        )
        return q_out, k_out


def _qk_weights_and_outputs(
    spec: QkNormSpec,
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor | None,
    wk: torch.Tensor | None,
    q_out: torch.Tensor | None,
    k_out: torch.Tensor | None,
    shapes: tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A QK-norm torch call's weights checked (both exactly when weight_mode is not NONE) and its outputs: the given
    ones checked, or new ones, each in its part's stored dtype and of its input's shape (or of `shapes`)."""
    none = spec.params.weight_mode is WeightMode.NONE
    if (wq is None or wk is None) != none or (wq is None) != (wk is None):
        raise ValueError("both weights are required exactly when weight_mode is not NONE")
    if wq is not None:
        _check_tensor("wq", wq, spec.weight_dtype, (spec.q_hidden,))
        _check_tensor("wk", wk, spec.weight_dtype, (spec.k_hidden,))
    shapes = shapes or (None, None)
    q_out, k_out = (
        _output(name, given, like, spec.part_y_dtype(part), shape)
        for part, (name, given, like, shape) in enumerate(
            (("q_out", q_out, q, shapes[0]), ("k_out", k_out, k, shapes[1]))
        )
    )
    return q_out, k_out


class QkNormRopeKernel(_Kernel):
    """QK-norm + rotary embedding: q and k read once, each head row normalised and rotated, written once. One
    variant (the kernel tests its pointers' alignment itself: the 16-byte path, or one element at a time)."""

    _launch_args = 14
    spec: QkNormRopeSpec

    def variant(self) -> QkNormRopeVariant:
        return self.variant_for(self.spec, self.device.arch)

    @staticmethod
    def variant_for(spec: QkNormRopeSpec, arch: str) -> QkNormRopeVariant:
        """The one variant of `spec` for `arch`: the JIT's, and the AOT artifact's."""
        q, k = qk_norm_tilings(spec, aligned=True)
        return QkNormRopeVariant(spec, q, k, arch)

    def _variant_of(self, key: None) -> QkNormRopeVariant:
        return self.variant()

    def warm_up(self, max_rows: int) -> None:
        """Compile or load the variant (the tiling depends on neither the row count nor the pointers)."""
        del max_rows
        self._compiled(None)

    def launch(
        self,
        q_ptr: int,
        k_ptr: int,
        wq_ptr: int,
        wk_ptr: int,
        cos_ptr: int,
        sin_ptr: int,
        q_out_ptr: int,
        k_out_ptr: int,
        q_rows: int,
        k_rows: int,
        batch: int,
        seq_len: int,
        cos_batch: int,
        stream: int,
    ) -> None:
        """Enqueue on `stream`: `q_rows`, `k_rows` norm rows (q.numel() // q_hidden, ...), q's batch B, the sequence
        length S and cos's batch Bc (1 or B) of cos and sin [Bc, S, rotary_dim]; weight pointers 0 without weights.
        No allocation, no sync."""
        function = self._functions.get(None) or self._compiled(None)
        pointers = (q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr)
        function(*pointers, q_rows, k_rows, batch, seq_len, cos_batch, stream)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        wq: torch.Tensor | None = None,
        wk: torch.Tensor | None = None,
        q_out: torch.Tensor | None = None,
        k_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Torch convenience: q [B, S, Hq, D] or [B, S, Hq·D] (token-major), [B, Hq, S, D] (head-major), k alike;
        cos, sin [Bc, S, rotary_dim] with Bc 1 or B. Returns (q_out, k_out) of q's and k's shapes."""
        spec = self.spec
        _check_activation("q", q, spec.dtype, spec.q_hidden)
        _check_activation("k", k, spec.dtype, spec.k_hidden)
        batch, seq_len = _batch_and_sequence(q, spec)
        if _batch_and_sequence(k, spec) != (batch, seq_len):
            raise ValueError(f"k has shape {tuple(k.shape)}, whose batch and sequence differ from q's {tuple(q.shape)}")
        if cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seq_len:
            raise ValueError(f"cos has shape {tuple(cos.shape)}, expected [1 or {batch}, {seq_len}, R]")
        _check_tensor("cos", cos, spec.cos_dtype, (cos.shape[0], seq_len, spec.rope.rotary_dim))
        _check_tensor("sin", sin, spec.cos_dtype, tuple(cos.shape))
        shapes = None
        if spec.rope.moves_heads:
            shapes = tuple(
                attention_dims(t.shape, hidden, spec.rope.head_dim)
                for t, hidden in ((q, spec.q_hidden), (k, spec.k_hidden))
            )
        q_out, k_out = _qk_weights_and_outputs(spec, q, k, wq, wk, q_out, k_out, shapes)
        pointers = [t.data_ptr() for t in (q, k)] + [0 if w is None else w.data_ptr() for w in (wq, wk)]
        pointers += [t.data_ptr() for t in (cos, sin, q_out, k_out)]
        rows = (q.numel() // spec.q_hidden, k.numel() // spec.k_hidden)
        self.launch(*pointers, *rows, batch, seq_len, cos.shape[0], _current_stream())
        return q_out, k_out


def _batch_and_sequence(t: torch.Tensor, spec: QkNormRopeSpec) -> tuple[int, int]:
    """(B, S) of an activation in the spec's layout: [B, S, H, D] or [B, S, H·D] token-major, [B, H, S, D]
    head-major."""
    if spec.rope.layout == "head_major":
        if t.dim() != 4:
            raise ValueError(f"a head-major activation is [B, H, S, D], got shape {tuple(t.shape)}")
        return t.shape[0], t.shape[2]
    if t.dim() not in (3, 4):
        raise ValueError(f"a token-major activation is [B, S, H, D] or [B, S, H*D], got shape {tuple(t.shape)}")
    return t.shape[0], t.shape[1]


def _get(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, kind: type) -> Any:
    kernel = _kernels.get(spec)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.get(spec)
            if kernel is None:
                kernel = kind(spec, shared_cache(), current_device())
                _kernels[spec] = kernel
    return kernel


def get_rms_norm(spec: RmsNormSpec) -> RmsNormKernel:
    """The process's one kernel object for `spec`."""
    return _get(spec, RmsNormKernel)


def get_add_rms_norm(spec: AddRmsNormSpec) -> AddRmsNormKernel:
    """The process's one kernel object for `spec`."""
    return _get(spec, AddRmsNormKernel)


def get_qk_norm(spec: QkNormSpec) -> QkNormKernel:
    """The process's one kernel object for `spec`."""
    return _get(spec, QkNormKernel)


def get_qk_norm_rope(spec: QkNormRopeSpec) -> QkNormRopeKernel:
    """The process's one kernel object for `spec`."""
    return _get(spec, QkNormRopeKernel)
