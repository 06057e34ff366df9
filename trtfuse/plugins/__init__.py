"""TensorRT plugins for the fused norm nodes of contract.py, backed by the CuTeDSL kernels of trtfuse.kernels.

Importing this package needs neither TensorRT nor a GPU; `register()` imports TensorRT (see trt_module.py).
"""

from __future__ import annotations

from typing import Any

from trtfuse.contract import PLUGIN_NAMESPACE

# The registry keeps raw pointers to the creators: these references keep the Python objects alive for the process.
_creators: list[Any] = []


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
    registered trtfuse creators by plugin name.
    """
    from trtfuse.plugins.qk_norm import QkNormPluginCreator
    from trtfuse.plugins.rms_norm import RmsNormPluginCreator
    from trtfuse.plugins.trt_module import load_trt

    registry = load_trt().get_plugin_registry()
    present = _registered(registry)
    for creator_class in (RmsNormPluginCreator, QkNormPluginCreator):
        if creator_class.PLUGIN.OP not in present:
            creator = creator_class()
            registry.register_creator(creator, PLUGIN_NAMESPACE)
            _creators.append(creator)
    return _registered(registry)
