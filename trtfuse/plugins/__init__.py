"""TensorRT plugins for the fused norm nodes of contract.py, backed by the CuTeDSL kernels of trtfuse.kernels.

Importing this package needs neither TensorRT nor a GPU; `register()` imports TensorRT (see trt_module.py).
"""

from __future__ import annotations

from typing import Any

from trtfuse.contract import PLUGIN_NAMESPACE
from trtfuse.errors import TrtfuseError

# The registry keeps raw pointers to the creators: these references keep the Python objects alive for the process.
_creators: list[Any] = []
_creation_errors: list[str] = []


def _registered(registry: Any) -> dict[str, Any]:
    """The creators in `registry` under the trtfuse namespace, by plugin name."""
    return {
        creator.name: creator
        for creator in registry.all_creators
        if getattr(creator, "plugin_namespace", None) == PLUGIN_NAMESPACE
    }


def register() -> dict[str, Any]:
    """Register a creator for every fused-node kind in TensorRT's plugin registry, once per process.

    Safe to call any number of times, also when another copy of these creators is already registered. Returns the
    registered trtfuse creators by plugin name. Refused, with one line, in a process that registered the AOT plugins
    (the two kinds share names in the registry).
    """
    from trtfuse.contract import PluginKind
    from trtfuse.plugins.aot import claim_plugin_kind
    from trtfuse.plugins.qk_norm import QkNormPluginCreator
    from trtfuse.plugins.rms_norm import RmsNormPluginCreator
    from trtfuse.plugins.trt_module import load_trt

    claim_plugin_kind(PluginKind.PYTHON)
    registry = load_trt().get_plugin_registry()
    present = _registered(registry)
    for creator_class in (RmsNormPluginCreator, QkNormPluginCreator):
        if creator_class.PLUGIN.OP not in present:
            creator = creator_class()
            # False means TensorRT refused the creator (for one, another library holds the name): every build that
            # uses the plugin would then fail at the parser, so say so here.
            if not registry.register_creator(creator, PLUGIN_NAMESPACE):
                raise TrtfuseError(
                    f"TensorRT's plugin registry refused the {creator_class.PLUGIN.OP} creator in namespace "
                    f"'{PLUGIN_NAMESPACE}' (its log above says why)"
                )
            _creators.append(creator)
    return _registered(registry)


def record_creation_error(message: str) -> None:
    """Keep why a plugin creation failed: TensorRT's binding prints the exception and gives the ONNX parser a null
    plugin, whose message ("Could not create the plugin") does not say why."""
    _creation_errors.append(message)


def take_creation_errors() -> list[str]:
    """The messages of plugin creations that failed since the last call, oldest first."""
    taken = list(_creation_errors)
    _creation_errors.clear()
    return taken
