"""The bare-driver process: it must prove it runs artifacts with neither CuTeDSL nor TVM-FFI loaded, because
TensorRT launches them with no Python at all."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

FORBIDDEN_MODULES = ("cutlass", "tvm_ffi")


class ImportBlocker(importlib.abc.MetaPathFinder):
    """Fails any import of CuTeDSL or TVM-FFI in this process, so a stray import is an error where it happens."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in FORBIDDEN_MODULES:
            raise ImportError(f"{fullname} may not be imported in the bare-driver process (trtfuse.bench.aot check)")
        return None


def forbidden_imported() -> list[str]:
    """The CuTeDSL and TVM-FFI modules this process has imported."""
    return sorted(name for name in sys.modules if name.split(".")[0] in FORBIDDEN_MODULES)


def require_bare_process() -> None:
    """Exit naming them if CuTeDSL or TVM-FFI is imported; otherwise block both for the rest of the process."""
    present = forbidden_imported()
    if present:
        raise SystemExit(
            f"trtfuse.bench.aot check: the bare-driver process has imported {', '.join(present[:3])}"
            f"{' ...' if len(present) > 3 else ''} (trtfuse/kernels/__init__.py must not import CuTeDSL eagerly)"
        ) from None
    if not any(isinstance(finder, ImportBlocker) for finder in sys.meta_path):
        sys.meta_path.insert(0, ImportBlocker())
