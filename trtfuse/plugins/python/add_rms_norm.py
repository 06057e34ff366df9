"""TrtfuseAddRmsNorm: inputs (x, residual, weight), or (x, residual) when weight_mode is NONE; outputs y (the norm, in
output_dtype) and h (= x + residual, in x's dtype), both with x's shape.

x and residual share one dtype D and one shape; h is their sum computed in fp32 and rounded once to D, and y is
TrtfuseRmsNorm's y with h as its x, both written by one kernel launch.
"""

from __future__ import annotations

from trtfuse.contract import ADD_RMS_NORM
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class AddRmsNormPlugin(NormPlugin):
    """h = D(x + residual); y = h · rsqrt(mean(h², last axis) + epsilon) · (weight + weight_offset), per
    contract.WeightMode; one launch of `trtfuse.kernels.get_add_rms_norm` over x's rows (the residual has x's shape,
    checked in configure_plugin and on_shape_change)."""

    OP = ADD_RMS_NORM


class AddRmsNormPluginCreator(NormPluginCreator):
    PLUGIN = AddRmsNormPlugin
