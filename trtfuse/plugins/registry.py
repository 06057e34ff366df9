"""TensorRT's plugin registry as trtfuse uses it: which TensorRT builds the AOT plugins, one plugin kind per process,
registering either kind, and why a plugin creation failed.

Both kinds are creators of one name, namespace and version in TensorRT's one registry, so a process that held both
would build with whichever the registry returned: the first registration claims the process for its kind.
Importing this module needs neither TensorRT nor CuTeDSL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from trtfuse import contract
from trtfuse.errors import MissingDependencyError, TrtfuseError
from trtfuse.plugins.trt_module import load_trt

# The first TensorRT trtfuse builds AOT plugins with (docs/aot.md, "Which TensorRT"). AOT QDPs arrived in 10.9, whose
# ONNX parser may look a QDP up by the node's name instead of its op type (trtfuse's nodes are named after the norms
# they replace). From 10.10 to 10.13 the Python binding's aot_impl trampoline returns the kernel name as the
# `c_str()` of a string in a local tuple that is destroyed on return (python/src/infer/pyPlugin.cpp), so TensorRT reads
# freed memory for every name longer than the string's inline buffer; 10.14 keeps the name in a member.
AOT_MIN_TENSORRT = (10, 14)
# The first TensorRT that takes a quantized node's outputs, per dtype (docs/plugins.md, "Quantized outputs: which
# TensorRT"). IPluginV3 arrived in 10.0, whose getOutputDataTypes excludes only kBOOL and kUINT8
# (NvInferRuntime.h@v10.0.0:835 to @v11.1:916): INT8 from there. FP8 plugin I/O is first documented in 10.1, where
# BuilderFlag::kFP8 became "Enable plugins with FP8 input/output" (NvInfer.h@v10.1.0:8227; 10.0 says only "Enable FP8
# layer selection, with FP32 fallback"; deprecated in 10.12 for strong typing, gone in 11.0). trtfuse builds strongly
# typed networks, whose tensor types are the network's own, with no precision flag (trtexec turns kFP8 and kINT8 off
# for them: samples/common/sampleOptions.cpp@v10.14:1285-1301) and no INT8 dynamic range: the plugins read no
# PluginTensorDesc::scale, implicit quantization's ("TensorRT will set the value to -1.0F if it is invalid",
# NvInferRuntimePlugin.h@v11.1:66-67); the node carries its own scale.
QUANT_MIN_TENSORRT = {"int8": (10, 0), "float8_e4m3fn": (10, 1)}
# The trt.DataType member each quantized dtype's outputs take (`trt_module.quant_data_types`).
_QUANT_DATA_TYPE_MEMBERS = {"float8_e4m3fn": "FP8", "int8": "INT8"}

_lock = threading.Lock()
_claimed_kind: contract.PluginKind | None = None
_aot_registered = False
# The registry keeps raw pointers to the creators: these references keep the Python objects alive for the process.
_creators: list[Any] = []


def tensorrt_release(trt: ModuleType) -> tuple[int, int]:
    """(major, minor) of `trt.__version__` ("10.10.0.31" -> (10, 10)); (0, 0) when it does not say."""
    parts = str(getattr(trt, "__version__", "")).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def min_tensorrt_text() -> str:
    return ".".join(str(part) for part in AOT_MIN_TENSORRT)


def tensorrt_label(trt: ModuleType) -> str:
    """ "TensorRT" for the tensorrt module, the module's name for another (TensorRT-RTX's `tensorrt_rtx`)."""
    name = getattr(trt, "__name__", "tensorrt")
    return "TensorRT" if name == "tensorrt" else name


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


def quant_refusal(trt: ModuleType, dtypes: Iterable[str]) -> str | None:
    """Why `trt` cannot build plugin nodes with outputs in the quantized `dtypes` (contract.QUANT_DTYPE_CODES), in
    one sentence naming its version; None where it can."""
    label = f"{tensorrt_label(trt)} {getattr(trt, '__version__', '(unknown version)')}"
    release = tensorrt_release(trt)
    if release == (0, 0):
        return f"{label} does not say which release it is"
    for dtype in sorted(dtypes, key=lambda name: QUANT_MIN_TENSORRT[name], reverse=True):
        if release < QUANT_MIN_TENSORRT[dtype]:
            minimum = ".".join(map(str, QUANT_MIN_TENSORRT[dtype]))
            member = _QUANT_DATA_TYPE_MEMBERS[dtype]
            return f"{label} predates {minimum}, the first TensorRT that documents {member} plugin outputs (IPluginV3)"
    if not hasattr(trt, "IPluginV3"):
        return f"{label} has no IPluginV3, the plugin interface whose FP8 and INT8 outputs TensorRT documents"
    data_types = getattr(trt, "DataType", None)
    missing = sorted({_QUANT_DATA_TYPE_MEMBERS[dtype] for dtype in dtypes} - set(dir(data_types)))
    if missing:
        return f"{label} has no DataType.{missing[0]} for the quantized outputs"
    return None


def aot_supported(trt: ModuleType) -> bool:
    """Whether trtfuse builds its AOT plugins with `trt` (`aot_refusal` says why not)."""
    return aot_refusal(trt) is None


def claim_plugin_kind(kind: contract.PluginKind) -> None:
    """Record that this process registers trtfuse's `kind` plugins; refuse the other kind."""
    global _claimed_kind
    kind = contract.PluginKind(kind)
    if _claimed_kind not in (None, kind):
        raise TrtfuseError(
            f"this process registered trtfuse's {_claimed_kind.value} plugins; the {kind.value} plugins share their "
            "names in TensorRT's registry, so build with them in another process"
        )
    _claimed_kind = kind


def register(kind: contract.PluginKind) -> None:
    """The trtfuse creators of `kind` in TensorRT's plugin registry, once per process: the Python (IPluginV3) ones,
    or the AOT quickly deployable plugins. Refused, with one line, in a process that registered the other kind."""
    if contract.PluginKind(kind) is contract.PluginKind.AOT:
        register_aot()
    else:
        register_python()


def _registered(registry: Any) -> dict[str, Any]:
    """The creators in `registry` under the trtfuse namespace, by plugin name."""
    return {
        creator.name: creator
        for creator in registry.all_creators
        if getattr(creator, "plugin_namespace", None) == contract.PLUGIN_NAMESPACE
    }


def register_python() -> dict[str, Any]:
    """Register a Python creator for every op in TensorRT's plugin registry, once per process (also when another
    copy of these creators is already registered). Returns the registered trtfuse creators by plugin name."""
    from trtfuse.plugins.python.creators import CREATORS

    claim_plugin_kind(contract.PluginKind.PYTHON)
    registry = load_trt().get_plugin_registry()
    present = _registered(registry)
    for creator_class in CREATORS.values():
        if creator_class.PLUGIN.OP.name not in present:
            creator = creator_class()
            # False means TensorRT refused the creator (for one, another library holds the name): every build that
            # uses the plugin would then fail at the parser, so say so here.
            if not registry.register_creator(creator, contract.PLUGIN_NAMESPACE):
                raise TrtfuseError(
                    f"TensorRT's plugin registry refused the {creator_class.PLUGIN.OP.name} creator in namespace "
                    f"'{contract.PLUGIN_NAMESPACE}' (its log above says why)"
                )
            _creators.append(creator)
    return _registered(registry)


def register_aot() -> None:
    """Register every op's QDP in namespace trtfuse, once per process (later calls change nothing)."""
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
        present = sorted(name for name in _registered(trt.get_plugin_registry()) if name in contract.OPS)
        if present:
            raise TrtfuseError(
                f"TensorRT's plugin registry already holds {', '.join(present)} in namespace "
                f"'{contract.PLUGIN_NAMESPACE}'; the AOT plugins share those names, so register them in another process"
            )
        claim_plugin_kind(contract.PluginKind.AOT)
        from trtfuse.plugins.qdp import register_definitions

        register_definitions(trt)
        _aot_registered = True
