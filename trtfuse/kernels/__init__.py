"""CuTeDSL RMSNorm and QK-norm kernels for the trtfuse plugins (interface: docs/architecture.md, "Kernels")."""

from trtfuse.kernels.api import QkNormKernel, RmsNormKernel, get_qk_norm, get_rms_norm
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec

__all__ = ["QkNormKernel", "QkNormSpec", "RmsNormKernel", "RmsNormSpec", "get_qk_norm", "get_rms_norm"]
