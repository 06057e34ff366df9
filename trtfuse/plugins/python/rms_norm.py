"""TrtfuseRmsNorm: inputs (x, weight), or (x) when weight_mode is NONE; output y with x's shape, in output_dtype."""

from __future__ import annotations

from trtfuse.contract import RMS_NORM
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class RmsNormPlugin(NormPlugin):
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (weight + weight_offset), per contract.WeightMode; one launch
    of `trtfuse.kernels.get_rms_norm`."""

    OP = RMS_NORM


class RmsNormPluginCreator(NormPluginCreator):
    PLUGIN = RmsNormPlugin
