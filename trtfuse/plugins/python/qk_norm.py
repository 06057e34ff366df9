"""TrtfuseQkNorm: inputs (q, k, q_weight, k_weight), or (q, k) when weight_mode is NONE; outputs (q_out, k_out).
TrtfuseQkNormRope: the same, then cos and sin; each output rotated.

q and k share one dtype, q_out and k_out one output_dtype, and both one epsilon / weight_offset / weight_mode; each
is normalised over its own last axis (q_hidden_size, k_hidden_size) with its own weight, both in one kernel launch.
"""

from __future__ import annotations

from trtfuse.contract import QK_NORM, QK_NORM_ROPE
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class QkNormPlugin(NormPlugin):
    """The q-norm and k-norm of one attention block: two RMSNorms with shared constants, one launch of
    `trtfuse.kernels.get_qk_norm` with q's and k's row counts."""

    OP = QK_NORM


class QkNormPluginCreator(NormPluginCreator):
    PLUGIN = QkNormPlugin


class QkNormRopePlugin(QkNormPlugin):
    """The QK-norm and the rotary embedding of both outputs (TrtfuseQkNormRope): one launch of
    `trtfuse.kernels.get_qk_norm_rope`, which also reads cos and sin and the extents that locate their rows."""

    OP = QK_NORM_ROPE


class QkNormRopePluginCreator(NormPluginCreator):
    PLUGIN = QkNormRopePlugin
