"""Skip markers for what this machine may lack: TensorRT (and a TensorRT trtfuse builds AOT plugins with), Triton's
ModelConfig from tritonclient; each with the reason a reader of the test log needs."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_TENSORRT_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
NO_TENSORRT = "needs the real `tensorrt` module and an NVIDIA GPU (not installable here)"

needs_tensorrt = pytest.mark.skipif(not HAS_TENSORRT, reason=NO_TENSORRT)


def why_no_aot_tensorrt() -> str | None:
    """Why AOT plugins cannot be built here: no TensorRT, or one trtfuse refuses; None where they can."""
    if not HAS_TENSORRT:
        return "needs the real `tensorrt` module (>= 10.14) and an NVIDIA GPU (not installable here)"
    import tensorrt

    from trtfuse.plugins.registry import aot_refusal

    refusal = aot_refusal(tensorrt)
    return None if refusal is None else f"needs a TensorRT trtfuse builds AOT plugins with: {refusal}"


needs_aot_tensorrt = pytest.mark.skipif(why_no_aot_tensorrt() is not None, reason=str(why_no_aot_tensorrt()))


def _why_no_tritonclient() -> str | None:
    try:
        from tritonclient.grpc import model_config_pb2  # noqa: F401
    except (ImportError, RuntimeError):
        # tritonclient without its grpc extra raises RuntimeError from tritonclient.grpc.
        return "needs tritonclient[grpc] (Triton's ModelConfig): pip install -e '.[triton]'"
    return None


needs_tritonclient = pytest.mark.skipif(_why_no_tritonclient() is not None, reason=str(_why_no_tritonclient()))
