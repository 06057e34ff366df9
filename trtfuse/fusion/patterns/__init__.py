"""Find every RMSNorm, QK-norm and residual add-norm in an ONNX graph (onnx-graphsurgeon), or say why a candidate was
rejected."""

from trtfuse.fusion.patterns.matches import (
    AddNormMatch,
    NearMiss,
    NormSearch,
    QkNormPair,
    QkNormRopeMatch,
    RmsNormMatch,
    RotatedNorm,
    TakenQuantizer,
)
from trtfuse.fusion.patterns.search import find_norms

__all__ = [
    "AddNormMatch",
    "NearMiss",
    "NormSearch",
    "QkNormPair",
    "QkNormRopeMatch",
    "RmsNormMatch",
    "RotatedNorm",
    "TakenQuantizer",
    "find_norms",
]
