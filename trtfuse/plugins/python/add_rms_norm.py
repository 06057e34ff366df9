"""TrtfuseAddRmsNorm: inputs (x, residual, weight), or (x, residual) when weight_mode is NONE; outputs y (the norm, in
output_dtype) and h (= x + residual, in x's dtype), both with x's shape.

x and residual share one dtype D and one shape; h is their sum computed in fp32 and rounded once to D, and y is
TrtfuseRmsNorm's y with h as its x, both written by one kernel launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtfuse.contract import ADD_RMS_NORM
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class AddRmsNormPlugin(NormPlugin):
    """h = D(x + residual); y = h · rsqrt(mean(h², last axis) + epsilon) · (weight + weight_offset), per
    contract.WeightMode."""

    OP = ADD_RMS_NORM

    def _make_kernel(self, dtype: str, weight_dtype: str | None) -> Any:
        kernels = self._kernels()
        spec = kernels.AddRmsNormSpec(
            hidden=self.config.hidden_sizes[0], quant=self.config.quant, **self._spec_fields(dtype, weight_dtype)
        )
        return kernels.get_add_rms_norm(spec)

    def enqueue(
        self,
        input_desc: Sequence[Any],
        output_desc: Sequence[Any],
        inputs: Sequence[int],
        outputs: Sequence[int],
        workspace: int,
        stream: int,
    ) -> None:
        # x's rows: the residual has the same shape (checked in configure_plugin and on_shape_change).
        self._launch(
            inputs[0],
            inputs[1],
            inputs[2] if self._weighted else 0,
            outputs[0],
            outputs[1],
            self._rows[0],
            stream,
        )


class AddRmsNormPluginCreator(NormPluginCreator):
    PLUGIN = AddRmsNormPlugin
