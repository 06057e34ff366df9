"""TensorRT on the engine side: its import, and what an engine needs before it deserialises (`tensorrt_for`): the
Python plugins registered for a Python-plugin engine, nothing at all for an AOT engine (TensorRT embedded its kernels;
no trtfuse.plugins import, no Python plugin), and a CUDA driver that can JIT the PTX an AOT engine embeds.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtfuse.contract import PluginKind
from trtfuse.engine.engine_file import EngineFile
from trtfuse.errors import MissingDependencyError

INSTALL_HINT = (
    "install it with `pip install -e '.[gpu]'` in a trtfuse checkout (tensorrt>=10.14; the Python plugins alone run "
    "from 10.8) on a machine with an NVIDIA GPU"
)


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module: the one the plugins' `trt_module.load_trt` returns wherever it imports, taken without
    importing trtfuse.plugins (an AOT engine needs none of it). TensorRT-RTX, the plugins' test stand-in, cannot run
    them in an engine, so it is never taken here."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError:
        raise MissingDependencyError(f"TensorRT's Python module `tensorrt` is not installed; {INSTALL_HINT}") from None


def register_plugins(kind: PluginKind) -> None:
    """The trtfuse creators of one kind in TensorRT's plugin registry: the Python (IPluginV3) ones, or the AOT
    quickly deployable plugins. Both kinds go by the same names and namespace, and the registry holds one creator per
    name, so once a process holds one kind the plugins refuse the other, with one line."""
    from trtfuse.plugins.registry import register

    register(kind)


def tensorrt_for(engine: EngineFile) -> ModuleType:
    """TensorRT, ready to deserialise `engine`: the Python plugins registered for an engine of that kind, nothing at
    all for an AOT engine (TensorRT embedded its kernels; no trtfuse.plugins import, no Python plugin)."""
    trt = import_tensorrt()
    if engine.plugin_kind is PluginKind.PYTHON:
        register_plugins(PluginKind.PYTHON)
    else:
        problem = embedded_ptx_problem(engine)
        if problem is not None:
            raise MissingDependencyError(
                f"{engine.path}: {problem}: update the driver, or rebuild the engine where nvidia-cutlass-dsl's "
                "CUDA 12 libraries are installed (their PTX needs CUDA 12.9)"
            )
    return trt


def embedded_ptx_problem(engine: EngineFile) -> str | None:
    """Why this machine's CUDA driver cannot JIT the AOT kernels the sidecar says the engine embeds; None when it can,
    or without cuda-python to ask."""
    isas = engine.sidecar.ptx_isa if engine.sidecar else ()
    if not isas:
        return None
    try:
        from trtfuse.kernels.device import current_device, driver_version, isa_driver_problem
    except ImportError:
        return None
    driver = driver_version()
    if driver is None:
        return None
    target = current_device().arch
    problems = [problem for isa in isas if (problem := isa_driver_problem(isa, driver, target))]
    return problems[-1] if problems else None


def plugin_creation_errors() -> list[str]:
    from trtfuse.plugins.creation_errors import take_creation_errors

    return take_creation_errors()
