"""trtfuse inside `polygraphy run`: Polygraphy loaders and runners for the fused model, and the argument groups that
add `--trtfuse-onnxrt` and `--trtfuse` to `polygraphy run` (entry point group `polygraphy.run.plugins`).

Scripts written by `polygraphy run --gen-script` import the loaders and runners from here.
"""

from trtfuse.polygraphy_ext.loaders import BuildTrtfuseEngine, FusedModel, FuseModel, LowerFusedNodes
from trtfuse.polygraphy_ext.runners import FusedOnnxrtRunner, TrtfuseTrtRunner

__all__ = [
    "BuildTrtfuseEngine",
    "FuseModel",
    "FusedModel",
    "FusedOnnxrtRunner",
    "LowerFusedNodes",
    "TrtfuseTrtRunner",
]
