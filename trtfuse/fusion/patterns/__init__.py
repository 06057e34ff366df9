"""Find every RMSNorm and QK-norm in an ONNX graph (onnx-graphsurgeon), or say why a candidate was rejected."""

from trtfuse.fusion.patterns.matches import NearMiss, NormSearch, QkNormPair, RmsNormMatch
from trtfuse.fusion.patterns.search import find_norms

__all__ = ["NearMiss", "NormSearch", "QkNormPair", "RmsNormMatch", "find_norms"]
