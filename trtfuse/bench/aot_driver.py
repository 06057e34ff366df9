"""AOT kernel artifacts launched with the bare CUDA driver API, as TensorRT launches the ones it embeds (issue 9).

    python -m trtfuse.bench.aot_driver compile --out DIR [--arch ARCH] [--jobs N]
    python -m trtfuse.bench.aot_driver check DIR [--json PATH]

`compile` (imports CuTeDSL) writes every artifact of the matrix (the specs of tests/gpu/test_kernels_gpu.py, each
tactic) as `<stem>.ptx`, `<stem>.cubin` and `<stem>.json` (the launch declaration), plus `manifest.json`. `check` runs
in a process that imports neither CuTeDSL nor TVM-FFI (it blocks both and asserts it): it loads each artifact with
cuModuleLoadData (the PTX, then the cubin), launches it with cuLaunchKernel exactly as its declaration says, on torch
CUDA tensors with NaN-poisoned outputs, and compares with the float64 reference (trtfuse/bench/reference.py): 0, 1, 3,
SM-count, 4097 and 16384 rows (QK-norm: that many tokens, GQA head counts), pointers one element off alignment,
replays of a captured CUDA graph, weight_mode NONE with a NaN placeholder weight (never read).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.abc
import itertools
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cuda.bindings.driver as cuda_driver
import torch

from trtfuse.bench.reference import norm_reference
from trtfuse.contract import AOT_PLACEHOLDER_WEIGHT_DTYPE, NormParams, WeightMode
from trtfuse.kernels.declaration import KernelArtifact, LaunchDeclaration, ParamRole, Tactic
from trtfuse.kernels.device import arch_for, current_device, driver_version, ptx_driver_problem
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE

# The process that launches artifacts must prove it needs neither (issue 9: TensorRT runs them with no Python).
FORBIDDEN_MODULES = ("cutlass", "tvm_ffi")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
DEFAULT_SHARED_LIMIT_BYTES = 48 * 1024  # more needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first
U32_LIMIT = 1 << 32
U64_LIMIT = 1 << 64
# Each row part's tensors, by parameter name: (activation, weight, output).
PART_TENSORS = {"x": ("x", "weight", "y"), "q": ("q", "q_weight", "q_out"), "k": ("k", "k_weight", "k_out")}
LARGE_ROWS = 16384
RAGGED_ROWS = 4097  # one row past a whole number of prefill blocks of every tiling
GRAPH_ROWS = 32
GRAPH_REPLAYS = 2


# --- the bare-driver process ------------------------------------------------------------------------------------------


class _ForbiddenImport(importlib.abc.MetaPathFinder):
    """Fails any import of CuTeDSL or TVM-FFI in this process, so a stray import is an error where it happens."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in FORBIDDEN_MODULES:
            raise ImportError(f"{fullname} may not be imported in the bare-driver process (aot_driver check)")
        return None


def forbidden_imported() -> list[str]:
    """The CuTeDSL and TVM-FFI modules this process has imported."""
    return sorted(name for name in sys.modules if name.split(".")[0] in FORBIDDEN_MODULES)


def require_bare_process() -> None:
    """Exit naming them if CuTeDSL or TVM-FFI is imported; otherwise block both for the rest of the process."""
    present = forbidden_imported()
    if present:
        raise SystemExit(
            f"aot_driver check: the bare-driver process has imported {', '.join(present[:3])}"
            f"{' ...' if len(present) > 3 else ''} (trtfuse/kernels/__init__.py must not import CuTeDSL eagerly)"
        ) from None
    if not any(isinstance(finder, _ForbiddenImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ForbiddenImport())


# --- kernel arguments -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedParams:
    """cuLaunchKernel's `kernelParams`: an array of pointers, one per kernel parameter, each to its value's bytes.

    cuda-bindings takes the array's address as an int (cuda/bindings/_lib/utils.pxi, _HelperKernelParams); the
    driver copies the values at the call (or at capture, in a CUDA graph), so these must live only until it returns.
    """

    values: tuple[ctypes.c_uint64 | ctypes.c_uint32, ...]
    array: ctypes.Array

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def argument_values(declaration: LaunchDeclaration, pointers: Mapping[str, int], rows: Sequence[int]) -> list[int]:
    """Each kernel parameter's value in declaration order: pointers by parameter name, the scalars from the row
    counts (declaration.scalars)."""
    expected = set(pointer_names(declaration))
    if set(pointers) != expected:
        raise ValueError(f"{declaration.kernel_name} takes pointers {sorted(expected)}, got {sorted(pointers)}")
    scalars = list(declaration.scalars(rows))
    scalar_params = [p for p in declaration.params if p.role is ParamRole.SCALAR]
    if len(scalars) != len(scalar_params):
        raise ValueError(f"{declaration.kernel_name}: {len(scalar_params)} scalar parameters, {len(scalars)} scalars")
    by_name = dict(zip((p.name for p in scalar_params), scalars, strict=True)) | dict(pointers)
    return [by_name[p.name] for p in declaration.params]


def pack_params(declaration: LaunchDeclaration, values: Sequence[int]) -> PackedParams:
    """Pointers as u64 and scalars as u32, in parameter order (the `.param` types of the PTX entry)."""
    if len(values) != len(declaration.params):
        raise ValueError(f"{declaration.kernel_name} has {len(declaration.params)} parameters, got {len(values)}")
    packed: list[ctypes.c_uint64 | ctypes.c_uint32] = []
    for param, value in zip(declaration.params, values, strict=True):
        scalar = param.role is ParamRole.SCALAR
        limit = U32_LIMIT if scalar else U64_LIMIT
        if not 0 <= value < limit:
            raise ValueError(f"{declaration.kernel_name}: {param.name} = {value} does not fit {param.ptx_type}")
        packed.append(ctypes.c_uint32(value) if scalar else ctypes.c_uint64(value))
    array = (ctypes.c_void_p * len(packed))(*(ctypes.addressof(v) for v in packed))
    return PackedParams(tuple(packed), array)


def unpack_params(declaration: LaunchDeclaration, packed: PackedParams) -> list[int]:
    """The values the driver will read through `packed.address` (for tests of the packing)."""
    pointer_array = ctypes.cast(packed.address, ctypes.POINTER(ctypes.c_void_p))
    values = []
    for i, param in enumerate(declaration.params):
        kind = ctypes.c_uint32 if param.role is ParamRole.SCALAR else ctypes.c_uint64
        values.append(ctypes.cast(pointer_array[i], ctypes.POINTER(kind)).contents.value)
    return values


# --- the CUDA driver --------------------------------------------------------------------------------------------------


def check_cu(result: Any, what: str) -> Any:
    """Unwrap a cuda-bindings (CUresult, values...) tuple, raising with the call and the error name on failure."""
    err, *values = result
    if err != cuda_driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def bind_torch_context() -> None:
    """Make torch's CUDA context (the device's primary context) current on this thread for the driver calls."""
    torch.empty(1, device="cuda")  # the runtime creates the primary context on first use
    check_cu(cuda_driver.cuInit(0), "cuInit")
    context = check_cu(cuda_driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(context) == 0:
        device = check_cu(cuda_driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
        context = check_cu(cuda_driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        check_cu(cuda_driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def module_image(artifact: KernelArtifact, image: str) -> bytes:
    """What cuModuleLoadData takes: the PTX as NUL-terminated text, or the cubin's bytes."""
    if image == "ptx":
        return artifact.ptx.encode() + b"\0"
    if image == "cubin":
        return artifact.cubin
    raise ValueError(f"image must be 'ptx' or 'cubin', got {image!r}")


class DriverKernel:
    """One artifact loaded into the current context, launched only through the CUDA driver API."""

    def __init__(self, artifact: KernelArtifact, image: str) -> None:
        self.declaration = artifact.declaration
        self.image = image
        loaded = cuda_driver.cuModuleLoadData(module_image(artifact, image))
        self._module = check_cu(loaded, f"cuModuleLoadData({image})")
        name = self.declaration.kernel_name
        self._function = check_cu(
            cuda_driver.cuModuleGetFunction(self._module, name.encode()), f"cuModuleGetFunction({name})"
        )
        if self.declaration.shared_mem > DEFAULT_SHARED_LIMIT_BYTES:
            attribute = cuda_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            result = cuda_driver.cuFuncSetAttribute(self._function, attribute, self.declaration.shared_mem)
            check_cu(result, "cuFuncSetAttribute")

    def launch(self, pointers: Mapping[str, int], rows: Sequence[int], stream: int) -> None:
        """Enqueue on `stream` (a CUstream as int): grid from the row counts, block and shared memory as declared."""
        declaration = self.declaration
        packed = pack_params(declaration, argument_values(declaration, pointers, rows))
        result = cuda_driver.cuLaunchKernel(
            self._function,
            declaration.grid_x(rows),
            1,
            1,
            declaration.block_threads,
            1,
            1,
            declaration.shared_mem,
            stream,
            packed.address,
            0,
        )
        check_cu(result, f"cuLaunchKernel({declaration.kernel_name})")

    def unload(self) -> None:
        check_cu(cuda_driver.cuModuleUnload(self._module), "cuModuleUnload")


# --- artifacts on disk ------------------------------------------------------------------------------------------------


def write_artifact(folder: Path, stem: str, artifact: KernelArtifact) -> None:
    (folder / f"{stem}.ptx").write_text(artifact.ptx)
    (folder / f"{stem}.cubin").write_bytes(artifact.cubin)
    (folder / f"{stem}.json").write_text(artifact.declaration.dumps())


def read_artifact(folder: Path, stem: str) -> KernelArtifact:
    paths = [folder / f"{stem}.{suffix}" for suffix in ("json", "ptx", "cubin")]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: artifact file missing (run `aot_driver compile --out {folder}`)")
    declaration = LaunchDeclaration.from_json(json.loads(paths[0].read_text()))
    return KernelArtifact(declaration, paths[1].read_text(), paths[2].read_bytes())


def spec_to_json(spec: RmsNormSpec | QkNormSpec) -> dict[str, Any]:
    data = dataclasses.asdict(spec)
    data["params"]["weight_mode"] = int(spec.params.weight_mode)
    data["kind"] = "rms_norm" if hasattr(spec, "hidden") else "qk_norm"
    return data


def spec_from_json(data: Mapping[str, Any]) -> RmsNormSpec | QkNormSpec:
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields["params"] = NormParams(**fields["params"])
    kinds = {"rms_norm": RmsNormSpec, "qk_norm": QkNormSpec}
    if data.get("kind") not in kinds:
        raise ValueError(f"spec kind {data.get('kind')!r} is not one of {sorted(kinds)}")
    return kinds[data["kind"]](**fields)


# --- the matrix -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixEntry:
    """One spec to compile and check; `heads` (q, k) per token for QK-norm, None for RMSNorm."""

    spec: RmsNormSpec | QkNormSpec
    heads: tuple[int, int] | None = None


def matrix() -> list[MatrixEntry]:
    """Every spec of tests/gpu/test_kernels_gpu.py (dtype pairs and modes, hidden sizes, prefill re-reads, unaligned
    pointers, mixed precision, the CUDA-graph specs; QK-norm with its head counts), each once."""
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    dtypes = ("float32", "float16", "bfloat16")
    hiddens = (64, 128, 1000, 2048, 4096, 5120, 8192)
    mixed_pairs = (("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"))

    def sixteen_bit(dtype: str, out: str) -> str:
        return dtype if dtype != "float32" else out

    rms = [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode))
        for act, wdt in itertools.product(dtypes, dtypes)
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none)) for act in dtypes]
    rms += [
        RmsNormSpec(hidden, dtype, wdt, NormParams(1e-6, offset, mode))
        for hidden in hiddens
        for dtype, wdt, offset, mode in (
            ("bfloat16", "bfloat16", 0.0, after),
            ("float16", "float32", 1.0, before),
            ("float32", "bfloat16", 1.0, after),
        )
    ]
    rms += [
        RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 1.0, before)),
        RmsNormSpec(8192, "bfloat16", "float16", NormParams(1e-5, 0.0, after)),
        RmsNormSpec(8192, "float16", None, NormParams(1e-6, 0.0, none)),
        RmsNormSpec(5120, "float16", "float16", NormParams(1e-6, 1.0, after)),
        RmsNormSpec(3000, "bfloat16", None, NormParams(1e-6, 0.0, none)),
    ]
    rms += [RmsNormSpec(hidden, "bfloat16", "float32", NormParams(1e-6, 0.0, after)) for hidden in (1001, 4096)]
    rms += [RmsNormSpec(4096, "float16", "float32", NormParams(3e-6, 0.0, after))]
    rms += [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode), out)
        for act, out in mixed_pairs
        for wdt in ("float32", sixteen_bit(act, out))
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none), out) for act, out in mixed_pairs]
    rms += [
        RmsNormSpec(hidden, dtype, sixteen_bit(dtype, out), NormParams(1e-6, 0.0, after), out)
        for hidden in (*hiddens, 1004, 1001)
        for dtype, out in (("float32", "bfloat16"), ("bfloat16", "float32"))
    ]
    rms += [
        RmsNormSpec(4096, dtype, "float32", NormParams(1e-6, 0.0, after), out)
        for dtype, out in (("float32", "float16"), ("float16", "float32"))
    ]
    rms += [RmsNormSpec(4096, "float32", "bfloat16", NormParams(7e-6, 0.0, after), "bfloat16")]
    qk = [
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before)), (8, 4)),
        (QkNormSpec(64, 64, "float16", "float16", NormParams(1e-5, 0.0, after)), (16, 16)),
        (QkNormSpec(128, 128, "float32", None, NormParams(1e-6, 0.0, none)), (8, 2)),
        (QkNormSpec(4096, 1024, "bfloat16", "float32", NormParams(1e-6, 0.0, before)), (1, 1)),
        (QkNormSpec(8192, 5120, "float16", "float16", NormParams(1e-6, 1.0, after)), (1, 1)),
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(128, 128, "float32", "bfloat16", NormParams(1e-6, 0.0, after), "bfloat16"), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before), "float32"), (32, 8)),
        (QkNormSpec(4096, 1024, "float16", "float32", NormParams(1e-6, 0.0, after), "float32"), (1, 1)),
    ]
    entries = [MatrixEntry(spec) for spec in rms] + [MatrixEntry(spec, heads) for spec, heads in qk]
    return list(dict.fromkeys(entries))


def entry_name(entry: MatrixEntry) -> str:
    """A readable file-name stem for an entry (unique together with its index in the manifest)."""
    spec = entry.spec
    params = spec.params
    size = f"h{spec.hidden}" if entry.heads is None else f"q{spec.q_hidden}k{spec.k_hidden}"
    kind = "rms" if entry.heads is None else "qk"
    weight = spec.weight_dtype or "noweight"
    mode = params.weight_mode.name.lower()
    return (
        f"{kind}-{size}-{spec.dtype}-{weight}-{spec.out_dtype}-{mode}-eps{params.epsilon:g}-off{params.weight_offset:g}"
    )


# --- the cases --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchCase:
    """One launch to check: `tokens` rows (RMSNorm) or tokens of `heads` rows each (QK-norm), the pointers in
    `shifted` one element off the allocation's alignment, or launched from replays of a captured CUDA graph;
    `null`: every pointer 0 (what a runtime may pass for empty tensors; 0 tokens only)."""

    tokens: int
    shifted: tuple[str, ...] = ()
    graph: bool = False
    null: bool = False

    def label(self) -> str:
        parts = [f"tokens={self.tokens}"]
        if self.shifted:
            parts.append("shifted=" + ",".join(self.shifted))
        if self.null:
            parts.append("null pointers")
        if self.graph:
            parts.append("graph")
        return " ".join(parts)


def pointer_names(declaration: LaunchDeclaration) -> tuple[str, ...]:
    return tuple(p.name for p in declaration.params if p.role is not ParamRole.SCALAR)


def launch_cases(declaration: LaunchDeclaration, sm_count: int) -> list[LaunchCase]:
    """0 rows (a no-op), 1, 3, one per SM, a ragged and a large count; each pointer alone and all of them one
    element off alignment; a graph capture, aligned and shifted."""
    pointers = pointer_names(declaration)
    cases = [LaunchCase(tokens) for tokens in (0, 1, 3, sm_count, RAGGED_ROWS, LARGE_ROWS)]
    cases += [LaunchCase(3, (name,)) for name in pointers]
    cases += [LaunchCase(tokens, pointers) for tokens in (1, sm_count + 1, RAGGED_ROWS)]
    cases += [LaunchCase(GRAPH_ROWS, graph=True), LaunchCase(3, pointers, graph=True)]
    return cases


def part_rows(entry: MatrixEntry, tokens: int) -> tuple[int, ...]:
    """Each row part's row count for `tokens` tokens: the rows themselves, or tokens x (q heads, k heads)."""
    if entry.heads is None:
        return (tokens,)
    return tuple(tokens * heads for heads in entry.heads)


def part_hidden(entry: MatrixEntry) -> tuple[int, ...]:
    spec = entry.spec
    return (spec.hidden,) if entry.heads is None else (spec.q_hidden, spec.k_hidden)


def rounded_to(spec: RmsNormSpec | QkNormSpec) -> str | None:
    """AFTER_CAST's 16-bit intermediate R, whose last-place units then set the tolerance; None otherwise."""
    if spec.params.weight_mode is not WeightMode.AFTER_CAST:
        return None
    return spec.dtype if spec.dtype != "float32" else spec.out_dtype


# --- tensors ----------------------------------------------------------------------------------------------------------


def offset_view(numel: int, dtype: torch.dtype, offset: int, device: str) -> torch.Tensor:
    """A 1-D tensor of `numel` elements starting `offset` elements into a fresh (aligned) allocation."""
    return torch.empty(offset + numel, dtype=dtype, device=device)[offset:]


def random_rows(rows: int, hidden: int, out: torch.Tensor) -> torch.Tensor:
    """Fill `out` (rows x hidden elements) with N(0, 1) rows scaled by a random per-row magnitude, so rows differ
    in size; returns it as rows x hidden."""
    x = torch.randn(rows, hidden, device=out.device, dtype=torch.float32)
    x *= torch.rand((rows, 1), device=out.device) * 4 + 0.1
    return out.view(rows, hidden).copy_(x)


@dataclass
class PartTensors:
    """One row part's buffers: activation, weight (a NaN placeholder in weight_mode NONE), output."""

    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    rows: int
    hidden: int


class CaseTensors:
    """The buffers of one launch case, each pointer shifted where the case says; outputs NaN-poisoned."""

    def __init__(
        self, entry: MatrixEntry, declaration: LaunchDeclaration, case: LaunchCase, device: str = "cuda"
    ) -> None:
        spec = entry.spec
        x_dtype, out_dtype = getattr(torch, spec.dtype), getattr(torch, spec.out_dtype)
        no_weight = spec.weight_dtype is None
        w_dtype = getattr(torch, AOT_PLACEHOLDER_WEIGHT_DTYPE if no_weight else spec.weight_dtype)
        self.entry = entry
        self.null = case.null
        self.rows = part_rows(entry, case.tokens)
        self.parts: dict[str, PartTensors] = {}
        for part, rows, hidden in zip(declaration.parts, self.rows, part_hidden(entry), strict=True):
            x_name, w_name, out_name = PART_TENSORS[part.name]

            def offset(name: str) -> int:
                return 1 if name in case.shifted else 0

            # A 0-row launch still gets one row of every buffer: it must leave the poisoned output untouched.
            allocated = max(rows, 1)
            x = random_rows(allocated, hidden, offset_view(allocated * hidden, x_dtype, offset(x_name), device))
            weight = offset_view(hidden, w_dtype, offset(w_name), device)
            if no_weight:
                # The plugins' placeholder ([H] of AOT_PLACEHOLDER_WEIGHT_DTYPE), NaN: a read would poison y.
                weight.fill_(float("nan"))
            else:
                random_rows(1, hidden, weight)
            out = offset_view(allocated * hidden, out_dtype, offset(out_name), device).fill_(float("nan"))
            self.parts[part.name] = PartTensors(x, weight, out, rows, hidden)

    def pointers(self) -> dict[str, int]:
        result = {}
        for part_name, part in self.parts.items():
            x_name, w_name, out_name = PART_TENSORS[part_name]
            result |= {x_name: part.x.data_ptr(), w_name: part.weight.data_ptr(), out_name: part.out.data_ptr()}
        return dict.fromkeys(result, 0) if self.null else result

    def refresh(self) -> None:
        """Fresh random activations and re-poisoned outputs in the same buffers (for another graph replay)."""
        for part in self.parts.values():
            random_rows(max(part.rows, 1), part.hidden, part.x)
            part.out.fill_(float("nan"))


@dataclass(frozen=True)
class CaseResult:
    artifact: str
    image: str
    case: str
    passed: bool
    detail: str = ""
    max_abs_err: float = 0.0
    worst_tolerance_ratio: float = 0.0  # max over elements of |y - ref| / (atol + rtol |ref|); <= 1 passes


def compare_part(spec: RmsNormSpec | QkNormSpec, part: PartTensors) -> tuple[bool, str, float, float]:
    """(passed, detail, max abs error, worst |error| / allowed) of one part's output against the reference."""
    out = part.out.view(max(part.rows, 1), part.hidden)
    if part.rows == 0:
        written = int((~torch.isnan(out)).sum())
        return written == 0, f"{written} elements written by a 0-row launch" if written else "", 0.0, 0.0
    x = part.x.view(part.rows, part.hidden)
    weight = None if spec.weight_dtype is None else part.weight
    reference = norm_reference(x, weight, spec.params, spec.out_dtype).double()
    rtol, atol = max(KERNEL_ELEMENTWISE[spec.out_dtype], KERNEL_ELEMENTWISE[rounded_to(spec) or "float32"])
    error = (out.double() - reference).abs()
    ratio = error / (atol + rtol * reference.abs())
    nan = int(torch.isnan(out).sum())
    worst = float(ratio.nan_to_num(nan=float("inf")).max())
    max_abs = float(error.nan_to_num(nan=float("inf")).max())
    if nan:
        return False, f"{nan} NaN elements (unwritten or computed)", max_abs, worst
    failing = int((ratio > 1).sum())
    if failing:
        return False, f"{failing} elements outside rtol {rtol:g} atol {atol:g}", max_abs, worst
    return True, "", max_abs, worst


def captured_launch(kernel: DriverKernel, pointers: Mapping[str, int], rows: Sequence[int]) -> torch.cuda.CUDAGraph:
    """One launch captured into a graph on a side stream, as an enqueue is under its caller's capture. Without
    torch.cuda.graph's context manager, whose gc.collect and empty_cache per capture would cost more than the
    hundreds of captures here."""
    torch.cuda.synchronize()  # the inputs were written on the default stream
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            kernel.launch(pointers, rows, stream.cuda_stream)
        finally:
            graph.capture_end()
    return graph


def run_case(kernel: DriverKernel, entry: MatrixEntry, case: LaunchCase, stem: str) -> CaseResult:
    """Launch one case (directly, or as replays of a captured graph) and compare every part's output."""
    tensors = CaseTensors(entry, kernel.declaration, case)
    pointers = tensors.pointers()
    replays = 1
    if case.graph:
        graph = captured_launch(kernel, pointers, tensors.rows)
        replays = GRAPH_REPLAYS
    max_abs = worst = 0.0
    for replay in range(replays):
        if case.graph:
            if replay:
                tensors.refresh()
            graph.replay()
        else:
            kernel.launch(pointers, tensors.rows, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        for name, part in tensors.parts.items():
            passed, detail, part_abs, part_worst = compare_part(entry.spec, part)
            max_abs, worst = max(max_abs, part_abs), max(worst, part_worst)
            if not passed:
                where = f"{name}, replay {replay}: " if case.graph else f"{name}: "
                return CaseResult(stem, kernel.image, case.label(), False, where + detail, max_abs, worst)
    return CaseResult(stem, kernel.image, case.label(), True, "", max_abs, worst)


# --- compile ----------------------------------------------------------------------------------------------------------


def tactics_of(entry: MatrixEntry) -> tuple[Tactic, ...]:
    from trtfuse.kernels import artifacts  # CuTeDSL: imported by `compile` only, never by `check`

    return artifacts.rms_norm_tactics(entry.spec) if entry.heads is None else artifacts.qk_norm_tactics(entry.spec)


def compile_one(spec_json: dict[str, Any], qk: bool, tactic: int, stem: str, arch: str, folder: str) -> str:
    """Compile one artifact (through the kernel cache) and write its files; runs in a worker process."""
    from trtfuse.kernels import artifacts

    spec = spec_from_json(spec_json)
    build = artifacts.qk_norm_artifact if qk else artifacts.rms_norm_artifact
    write_artifact(Path(folder), stem, build(spec, Tactic(tactic), arch))
    return stem


def compile_matrix(folder: Path, arch: str, jobs: int) -> dict[str, Any]:
    """Every entry's artifacts for every tactic into `folder`, and the manifest that lists them."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    folder.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "arch": arch, "entries": []}
    tasks = []
    for index, entry in enumerate(matrix()):
        name = f"{index:03d}-{entry_name(entry)}"
        spec = spec_to_json(entry.spec)
        stems = {}
        for tactic in tactics_of(entry):
            stems[tactic.name] = f"{name}-{tactic.name.lower()}"
            tasks.append((spec, entry.heads is not None, int(tactic), stems[tactic.name]))
        heads = None if entry.heads is None else list(entry.heads)
        manifest["entries"].append({"spec": spec, "heads": heads, "stems": stems})
    # Separate processes, not threads: CuTeDSL compiles under a process-wide lock.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(compile_one, *task, arch, str(folder)) for task in tasks]
        for done, future in enumerate(futures, 1):
            future.result()
            if done % 25 == 0 or done == len(futures):
                print(f"compiled {done}/{len(futures)} artifacts", flush=True)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# --- check ------------------------------------------------------------------------------------------------------------


class BadInput(Exception):
    """An artifact folder `check` cannot use: reported in one line, exit status 2."""


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BadInput(f"{path}: no manifest (run `python -m trtfuse.bench.aot_driver compile --out {folder}`)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BadInput(f"{path}: manifest format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}")
    return manifest


def manifest_entries(manifest: Mapping[str, Any]) -> Iterator[tuple[MatrixEntry, dict[str, str]]]:
    for item in manifest["entries"]:
        heads = None if item["heads"] is None else tuple(item["heads"])
        yield MatrixEntry(spec_from_json(item["spec"]), heads), item["stems"]


def device_arch_and_sms() -> tuple[str, int]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return arch_for(props.major, props.minor), props.multi_processor_count


IMAGES = ("ptx", "cubin")


def context_alive() -> bool:
    """Whether the CUDA context survived an error: a fault is sticky and fails every later synchronize."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


# Last, after every other case of every artifact: a fault here loses the context, and would lose the rest with it.
NULL_POINTER_CASES = (LaunchCase(0, null=True),)


def check_image(
    kernel: DriverKernel, entry: MatrixEntry, stem: str, cases: Sequence[LaunchCase], results: list[CaseResult]
) -> str:
    """Run `cases` on one loaded image into `results`; returns why the run must stop ("" to go on)."""
    for case in cases:
        try:
            results.append(run_case(kernel, entry, case, stem))
        except (RuntimeError, ValueError) as error:
            results.append(CaseResult(stem, kernel.image, case.label(), False, str(error)))
            if not context_alive():
                return f"{stem} {kernel.image} {case.label()}: {error}"
    return ""


def check_artifacts(folder: Path) -> dict[str, Any]:
    """Load every artifact of the manifest (PTX, then cubin) and run every case on each; a CUDA error that loses
    the context ends the run, recorded as the failing case."""
    manifest = read_manifest(folder)
    arch, sm_count = device_arch_and_sms()
    if manifest["arch"] != arch:
        raise BadInput(f"{folder / MANIFEST}: artifacts are for {manifest['arch']}, this GPU is {arch}")
    bind_torch_context()
    seed = torch.seed()  # fresh inputs in every run, replayable with torch.manual_seed(seed)
    start = time.perf_counter()
    results: list[CaseResult] = []
    aborted = ""
    driver = driver_version()
    # PTX this driver cannot JIT (an ISA newer than it knows: CuTeDSL built against a newer CUDA) is not loaded, and
    # said so; its cubin still runs. Any other load failure is a failure.
    unloadable: dict[str, str] = {}
    artifacts = [(entry, stem) for entry, stems in manifest_entries(manifest) for stem in stems.values()]
    passes = (lambda declaration: launch_cases(declaration, sm_count), lambda declaration: NULL_POINTER_CASES)
    images = list(itertools.product(artifacts, IMAGES))
    for done, (cases_of, ((entry, stem), image)) in enumerate(itertools.product(passes, images)):
        if done % 50 == 0:
            failed = sum(not r.passed for r in results)
            print(f"image {done + 1}/{len(passes) * len(images)}, {failed} failed cases so far", flush=True)
        artifact = read_artifact(folder, stem)
        problem = ptx_driver_problem(artifact.ptx, driver) if image == "ptx" else None
        if problem is not None:
            unloadable[stem] = problem
            continue
        try:
            kernel = DriverKernel(artifact, image)
        except RuntimeError as error:
            results.append(CaseResult(stem, image, "load", False, str(error)))
            continue
        aborted = check_image(kernel, entry, stem, cases_of(artifact.declaration), results)
        if aborted:
            break
        kernel.unload()
    failed = [r for r in results if not r.passed]
    return {
        "gpu": torch.cuda.get_device_name(),
        "arch": arch,
        "sms": sm_count,
        "seed": seed,
        "artifacts": len(artifacts),
        "cases": len(results),
        "failed": len(failed),
        "aborted": aborted,
        "ptx_not_loadable": unloadable,
        "forbidden_modules_imported": forbidden_imported(),
        "wall_s": time.perf_counter() - start,
        "results": [dataclasses.asdict(r) for r in results],
    }


def print_check(report: Mapping[str, Any]) -> None:
    failed = [r for r in report["results"] if not r["passed"]]
    for r in failed[:40]:
        print(f"FAIL {r['artifact']} [{r['image']}] {r['case']}: {r['detail']}")
    if len(failed) > 40:
        print(f"... and {len(failed) - 40} more failures (see the JSON)")
    worst = max((r["worst_tolerance_ratio"] for r in report["results"] if r["passed"]), default=0.0)
    print(
        f"\nAOT bare-driver check on {report['gpu']} ({report['arch']}, {report['sms']} SMs): "
        f"{report['artifacts']} artifacts x (ptx, cubin), {report['cases']} cases, {report['failed']} failed; "
        f"worst passing error {worst:.2f} of the allowed; CuTeDSL/TVM-FFI modules imported: "
        f"{report['forbidden_modules_imported'] or 'none'}; {report['wall_s']:.0f} s, torch seed {report['seed']}"
    )
    if report["aborted"]:
        print(f"aborted after a CUDA error: {report['aborted']}")
    unloadable = report.get("ptx_not_loadable") or {}
    if unloadable:
        reasons = sorted(set(unloadable.values()))
        print(f"PTX not loaded for {len(unloadable)} artifacts (their cubins ran): {'; '.join(reasons)}")


# --- command line -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile the matrix's artifacts (imports CuTeDSL)")
    compile_parser.add_argument("--out", type=Path, required=True, help="folder for the artifacts and manifest")
    compile_parser.add_argument("--arch", help="target architecture (default: this GPU's, or CUTE_DSL_ARCH/sm_90a)")
    compile_parser.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    check_parser = commands.add_parser("check", help="launch every artifact with the bare CUDA driver")
    check_parser.add_argument("folder", type=Path)
    check_parser.add_argument("--json", type=Path, help="also write every case's result here")
    args = parser.parse_args(argv)
    if args.command == "compile":
        arch = args.arch or current_device().arch
        manifest = compile_matrix(args.out, arch, max(1, args.jobs))
        count = sum(len(item["stems"]) for item in manifest["entries"])
        print(f"{count} artifacts for {arch} in {args.out}")
        return 0
    require_bare_process()
    if not torch.cuda.is_available():
        raise SystemExit("aot_driver check needs a CUDA GPU")
    try:
        report = check_artifacts(args.folder)
    except (BadInput, FileNotFoundError) as error:
        print(f"aot_driver check: {error}", file=sys.stderr)
        return 2
    report["forbidden_modules_imported"] = forbidden_imported()
    print_check(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    ok = report["failed"] == 0 and not report["forbidden_modules_imported"] and report["cases"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
