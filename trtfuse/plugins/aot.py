"""AOT plugins: TrtfuseRmsNorm and TrtfuseQkNorm as tensorrt.plugin definitions (QDPs) whose kernels TensorRT embeds
in the engine and launches itself, so that the engine runs without Python (docs/plugins.md, "AOT plugins").

Each QDP is three plain functions that `qdp_definitions` builds from tensorrt.plugin's types and `register_aot` alone
hands to its decorators: the output shapes and dtypes (`@trtp.register`), the type/format/tactic combinations
(`@trtp.autotune`) and, per chosen combination and tactic, the compiled kernel with its launch (`@trtp.aot_impl`).
tensorrt.plugin validates them with `inspect.signature` and calls them positionally: inputs, then every registered
field in registration order (contract.AOT_FIELDS, named as the contract names them), then `outputs` (and `tactic`).
This module therefore has no `from __future__ import annotations`, which would turn the annotations it checks into
strings; and the signatures can be read without TensorRT by passing stand-in types to `qdp_definitions`.

Importing this module needs neither TensorRT nor CuTeDSL: the kernels are imported when TensorRT calls autotune or
aot_impl during a build.
"""

import functools
import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from trtfuse import contract
from trtfuse.errors import MissingDependencyError, TrtfuseError
from trtfuse.plugins.trt_module import load_trt

LINEAR = "LINEAR"
# The first TensorRT trtfuse builds AOT plugins with (docs/aot.md, "Which TensorRT"). AOT QDPs arrived in 10.9, whose
# ONNX parser may look a QDP up by the node's name instead of its op type (trtfuse's nodes are named after the norms
# they replace). From 10.10 to 10.13 the Python binding's aot_impl trampoline returns the kernel name as the
# `c_str()` of a string in a local tuple that is destroyed on return (python/src/infer/pyPlugin.cpp), so TensorRT reads
# freed memory for every name longer than the string's inline buffer; 10.14 keeps the name in a member.
AOT_MIN_TENSORRT = (10, 14)
# Every field is annotated `bytes`: tensorrt.plugin makes its value as `bytes(field.data)`, the raw bytes of the
# one-element FLOAT32 or INT32 array the ONNX parser sends (its type is the attribute's, whatever the creator
# advertises), read back here with NumPy. `float`/`int` annotations make it `float(field.data)` on a one-element
# array, which NumPy >= 2.4 refuses; `numpy.typing.NDArray` ones fail tensorrt.plugin's `issubclass` checks on
# NumPy >= 2.5 and Python >= 3.13 (_lib.py create_plugin, _validate.py, v10.9.0 to v11.1; docs/plugins.md).
Float32Field = bytes
Int32Field = bytes
# tensorrt.plugin's spelling of each contract dtype in AutoTuneCombination type strings.
COMBINATION_TYPE_NAMES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}

_lock = threading.Lock()
_claimed_kind: contract.PluginKind | None = None
# The PTX ISA of every kernel handed to TensorRT in this process: the sidecar records it, since the CUDA driver that
# runs the engine must know it.
_embedded_ptx_isas: set[str] = set()
_aot_registered = False


@dataclass(frozen=True)
class QdpDefinition:
    """The functions of one QDP, before tensorrt.plugin's decorators see them."""

    op: str
    register: Callable[..., Any]
    autotune: Callable[..., Any]
    aot_impl: Callable[..., Any]

    @property
    def plugin_id(self) -> str:
        """tensorrt.plugin's "namespace::name"; the parser looks the plugin up by op_type and plugin_namespace."""
        return f"{contract.PLUGIN_NAMESPACE}::{self.op}"


def take_embedded_ptx_isas() -> list[str]:
    """The PTX ISA versions of the kernels handed to TensorRT since the last call, oldest first."""
    taken = sorted(_embedded_ptx_isas, key=lambda isa: tuple(int(part) for part in isa.split(".")))
    _embedded_ptx_isas.clear()
    return taken


def aot_supported(trt: ModuleType) -> bool:
    """Whether trtfuse builds its AOT plugins with `trt` (`aot_refusal` says why not)."""
    return aot_refusal(trt) is None


def aot_refusal(trt: ModuleType) -> str | None:
    """Why trtfuse builds no AOT plugins with `trt`, in one sentence naming its version; None where it does.
    tensorrt.plugin's own test for AOT is `QuickPluginCreationRequest`; the version decides the rest."""
    label = f"{tensorrt_label(trt)} {getattr(trt, '__version__', '(unknown version)')}"
    release = tensorrt_release(trt)
    if not hasattr(trt, "QuickPluginCreationRequest"):
        return f"{label} has no AOT plugins (tensorrt.plugin's aot_impl)"
    if release == (0, 0):
        return f"{label} does not say which release it is"
    if release < (10, 10):
        return f"{label}'s ONNX parser may look AOT plugins up by node name instead of op type"
    if release < AOT_MIN_TENSORRT:
        return (
            f"{label}'s Python binding hands TensorRT each AOT kernel's name in a string it has already freed "
            "(fixed in 10.14)"
        )
    return None


def tensorrt_label(trt: ModuleType) -> str:
    """ "TensorRT" for the tensorrt module, the module's name for another (TensorRT-RTX's `tensorrt_rtx`)."""
    name = getattr(trt, "__name__", "tensorrt")
    return "TensorRT" if name == "tensorrt" else name


def tensorrt_release(trt: ModuleType) -> tuple[int, int]:
    """(major, minor) of `trt.__version__` ("10.10.0.31" -> (10, 10)); (0, 0) when it does not say."""
    parts = str(getattr(trt, "__version__", "")).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def min_tensorrt_text() -> str:
    return ".".join(str(part) for part in AOT_MIN_TENSORRT)


def claim_plugin_kind(kind: contract.PluginKind) -> None:
    """Record that this process registers trtfuse's `kind` plugins; refuse the other kind.

    Both kinds are creators of one name, namespace and version in TensorRT's one plugin registry, so a process that
    held both would build with whichever the registry returned.
    """
    global _claimed_kind
    kind = contract.PluginKind(kind)
    if _claimed_kind not in (None, kind):
        raise TrtfuseError(
            f"this process registered trtfuse's {_claimed_kind.value} plugins; the {kind.value} plugins share their "
            "names in TensorRT's registry, so build with them in another process"
        )
    _claimed_kind = kind


def register_aot() -> None:
    """Register the TrtfuseRmsNorm and TrtfuseQkNorm QDPs in namespace trtfuse, once per process (later calls change
    nothing). Refused, with one line, in a process that registers the Python plugins."""
    global _aot_registered
    with _lock:
        if _aot_registered:
            return
        trt = load_trt()
        refusal = aot_refusal(trt)
        if refusal is not None:
            raise MissingDependencyError(
                f"{refusal}; trtfuse builds AOT plugins with TensorRT >= {min_tensorrt_text()}: build with the Python "
                "plugins instead"
            )
        # Refused before claiming, so that a refusal leaves this process free to build with the Python plugins.
        _refuse_registered_creators(trt)
        claim_plugin_kind(contract.PluginKind.AOT)
        trtp = importlib.import_module(f"{trt.__name__}.plugin")
        for definition in qdp_definitions(trtp):
            trtp.register(definition.plugin_id)(definition.register)
            trtp.autotune(definition.plugin_id)(definition.autotune)
            trtp.aot_impl(definition.plugin_id)(definition.aot_impl)
        _aot_registered = True


def _refuse_registered_creators(trt: ModuleType) -> None:
    """Creators by trtfuse's names already in the registry (the Python plugins, from a register() that claimed
    nothing, or another copy of trtfuse) would clash with the QDPs'."""
    present = sorted(
        {
            creator.name
            for creator in trt.get_plugin_registry().all_creators
            if getattr(creator, "plugin_namespace", None) == contract.PLUGIN_NAMESPACE
            and getattr(creator, "name", None) in contract.FUSED_OPS
        }
    )
    if present:
        raise TrtfuseError(
            f"TensorRT's plugin registry already holds {', '.join(present)} in namespace "
            f"'{contract.PLUGIN_NAMESPACE}'; the AOT plugins share those names, so register them in another process"
        )


def qdp_definitions(trtp: Any) -> tuple[QdpDefinition, QdpDefinition]:
    """Both QDPs, their signatures annotated with `trtp`'s TensorDesc, AutoTuneCombination, KernelLaunchParams and
    SymIntExprs (tensorrt.plugin's, or stand-ins to read the signatures without TensorRT)."""
    return _rms_norm(trtp), _qk_norm(trtp)


def _rms_norm(trtp: Any) -> QdpDefinition:
    TensorDesc = trtp.TensorDesc
    Kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def register(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
    ) -> TensorDesc:
        return _output_like(x, output_dtype)

    def autotune(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        from trtfuse.kernels.artifacts import rms_norm_tactics
        from trtfuse.kernels.specs import RmsNormSpec

        params, out_dtype = _params(epsilon, weight_offset, weight_mode), _dtype_of_code(output_dtype)
        combinations = []
        for dtype, weight_dtype in _dtype_choices(params, out_dtype):
            spec = RmsNormSpec(_int(hidden_size), dtype, _spec_weight_dtype(params, weight_dtype), params, out_dtype)
            types = (dtype, weight_dtype, out_dtype)
            combinations.append(_combination(trtp, types, rms_norm_tactics(spec)))
        return combinations

    def aot_impl(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc],
        tactic: int,
    ) -> Kernel:
        from trtfuse.kernels.artifacts import rms_norm_artifact
        from trtfuse.kernels.declaration import Tactic
        from trtfuse.kernels.specs import RmsNormSpec

        params = _params(epsilon, weight_offset, weight_mode)
        spec = RmsNormSpec(
            hidden=_int(hidden_size),
            dtype=_dtype_name(x.dtype),
            weight_dtype=_spec_weight_dtype(params, _dtype_name(weight.dtype)),
            params=params,
            out_dtype=_dtype_name(outputs[0].dtype),
        )
        return _kernel(trtp, rms_norm_artifact(spec, Tactic(tactic), _build_arch()), (x,))

    return QdpDefinition(contract.RMS_NORM_OP, register, autotune, aot_impl)


def _qk_norm(trtp: Any) -> QdpDefinition:
    TensorDesc = trtp.TensorDesc
    Kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def register(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
    ) -> tuple[TensorDesc, TensorDesc]:
        return _output_like(q, output_dtype), _output_like(k, output_dtype)

    def autotune(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        from trtfuse.kernels.artifacts import qk_norm_tactics
        from trtfuse.kernels.specs import QkNormSpec

        params, out_dtype = _params(epsilon, weight_offset, weight_mode), _dtype_of_code(output_dtype)
        combinations = []
        for dtype, weight_dtype in _dtype_choices(params, out_dtype):
            spec_weight = _spec_weight_dtype(params, weight_dtype)
            spec = QkNormSpec(_int(q_hidden_size), _int(k_hidden_size), dtype, spec_weight, params, out_dtype)
            types = (dtype, dtype, weight_dtype, weight_dtype, out_dtype, out_dtype)
            combinations.append(_combination(trtp, types, qk_norm_tactics(spec)))
        return combinations

    def aot_impl(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
        tactic: int,
    ) -> Kernel:
        from trtfuse.kernels.artifacts import qk_norm_artifact
        from trtfuse.kernels.declaration import Tactic
        from trtfuse.kernels.specs import QkNormSpec

        params = _params(epsilon, weight_offset, weight_mode)
        spec = QkNormSpec(
            q_hidden=_int(q_hidden_size),
            k_hidden=_int(k_hidden_size),
            dtype=_dtype_name(q.dtype),
            weight_dtype=_spec_weight_dtype(params, _dtype_name(q_weight.dtype)),
            params=params,
            out_dtype=_dtype_name(outputs[0].dtype),
        )
        return _kernel(trtp, qk_norm_artifact(spec, Tactic(tactic), _build_arch()), (q, k))

    return QdpDefinition(contract.QK_NORM_OP, register, autotune, aot_impl)


# --- what both QDPs share -----------------------------------------------------------------------------------------


def _field_value(field: bytes, kind: str) -> float | int:
    """The one number in a field's raw bytes: "f" (float) or "i" (int), 4 bytes as the ONNX parser sends FLOAT and
    INT attributes (FLOAT32, INT32), or 8 should a parser send them 64-bit."""
    raw = bytes(field)
    if len(raw) not in (4, 8):
        raise TrtfuseError(f"a trtfuse AOT plugin field holds {len(raw)} bytes, not one 4- or 8-byte number")
    return np.frombuffer(raw, dtype=np.dtype(f"{kind}{len(raw)}"))[0].item()


def _int(field: Int32Field) -> int:
    return int(_field_value(field, "i"))


def _float(field: Float32Field) -> float:
    return float(_field_value(field, "f"))


def _params(epsilon: Float32Field, weight_offset: Float32Field, weight_mode: Int32Field) -> contract.NormParams:
    return contract.NormParams(_float(epsilon), _float(weight_offset), contract.WeightMode(_int(weight_mode)))


def _dtype_of_code(field: Int32Field) -> str:
    code = _int(field)
    for name, known in contract.OUTPUT_DTYPE_CODES.items():
        if known == code:
            return name
    codes = ", ".join(f"{known} ({name})" for name, known in contract.OUTPUT_DTYPE_CODES.items())
    raise TrtfuseError(f"{contract.ATTR_OUTPUT_DTYPE} {code} is none of {codes}")


def _dtype_choices(params: contract.NormParams, out_dtype: str) -> list[tuple[str, str]]:
    """(activation dtype, weight input dtype) pairs the kernels take for `out_dtype`: every activation dtype that
    pairs with it, with every weight dtype, or with the placeholder's alone when weight_mode is NONE."""
    weights = (
        (contract.AOT_PLACEHOLDER_WEIGHT_DTYPE,)
        if params.weight_mode is contract.WeightMode.NONE
        else contract.WEIGHT_DTYPES
    )
    return [
        (dtype, weight_dtype)
        for dtype in contract.ACTIVATION_DTYPES
        if contract.dtype_pair_problem(dtype, out_dtype) is None
        for weight_dtype in weights
    ]


def _spec_weight_dtype(params: contract.NormParams, weight_dtype: str) -> str | None:
    """The kernel spec's weight dtype: none for weight_mode NONE, whose kernel never reads the placeholder."""
    return None if params.weight_mode is contract.WeightMode.NONE else weight_dtype


def _combination(trtp: Any, io_dtypes: Sequence[str], tactics: Sequence[int]) -> Any:
    """One fixed type combination (inputs then outputs), LINEAR throughout, with the spec's tactics."""
    types = ", ".join(COMBINATION_TYPE_NAMES[dtype] for dtype in io_dtypes)
    return trtp.AutoTuneCombination(types, LINEAR, [int(tactic) for tactic in tactics])


@functools.cache
def _data_types() -> dict[str, Any]:
    trt = load_trt()
    return {"float32": trt.DataType.FLOAT, "float16": trt.DataType.HALF, "bfloat16": trt.DataType.BF16}


def _dtype_name(data_type: Any) -> str:
    for name, known in _data_types().items():
        if known == data_type:
            return name
    raise TrtfuseError(f"the trtfuse AOT kernels take float32, float16 or bfloat16 tensors, not {data_type}")


def _output_like(activation: Any, output_dtype: Int32Field) -> Any:
    """A descriptor with `activation`'s shape expression and the node's output dtype."""
    output = activation.like()
    output.dtype = _data_types()[_dtype_of_code(output_dtype)]
    return output


def _build_arch() -> str:
    """The architecture of the GPU TensorRT builds on (the current CUDA context's): the PTX is compiled for it."""
    from trtfuse.kernels.device import current_device

    return current_device().arch


def _kernel(trtp: Any, artifact: Any, activations: Sequence[Any]) -> tuple[str, str, Any, Any]:
    """aot_impl's result for `artifact`: its entry name, its PTX, and its launch as expressions of the activations'
    symbolic shapes (rows = element count // hidden), by the declaration's own formula.

    Refused when this machine's driver cannot JIT the PTX (CuTeDSL built against a newer CUDA than the driver):
    TensorRT would fail to time it with a bare CUDA error."""
    from trtfuse.kernels.device import driver_version, ptx_driver_problem, ptx_isa

    problem = ptx_driver_problem(artifact.ptx, driver_version())
    if problem is not None:
        raise TrtfuseError(f"{problem}: update the driver, or build with the Python plugins")
    _embedded_ptx_isas.add(ptx_isa(artifact.ptx))
    declaration = artifact.declaration
    rows = declaration.rows_of([activation.shape_expr.numel() for activation in activations])
    grid_x, scalars = declaration.launch_values(rows, trtp.cdiv, lambda blocks: trtp.max(blocks, 1))
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid_x
    launch.block_x = declaration.block_threads
    launch.shared_mem = declaration.shared_mem
    extra_args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(scalar) for scalar in scalars])
    return declaration.kernel_name, artifact.ptx, launch, extra_args
