"""CuTeDSL RMSNorm, residual add+RMSNorm and QK-norm kernels for the trtfuse plugins (docs/architecture.md, "Kernels").

The names below are loaded on first use, so that importing a submodule that needs no CuTeDSL (`launch`, `specs`)
does not load it: the bare-driver harness and the AOT plugins' descriptions read declarations without compiling.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AddRmsNormKernel": "trtfuse.kernels.api",
    "get_add_rms_norm": "trtfuse.kernels.api",
    "AddRmsNormSpec": "trtfuse.kernels.specs",
    "QkNormKernel": "trtfuse.kernels.api",
    "QkNormRopeKernel": "trtfuse.kernels.api",
    "QkNormRopeSpec": "trtfuse.kernels.specs",
    "RopeParams": "trtfuse.kernels.specs",
    "get_qk_norm_rope": "trtfuse.kernels.api",
    "RmsNormKernel": "trtfuse.kernels.api",
    "get_qk_norm": "trtfuse.kernels.api",
    "get_rms_norm": "trtfuse.kernels.api",
    "QkNormSpec": "trtfuse.kernels.specs",
    "RmsNormSpec": "trtfuse.kernels.specs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trtfuse.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
