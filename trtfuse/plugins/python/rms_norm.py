"""TrtfuseRmsNorm: inputs (x, weight), or (x) when weight_mode is NONE; output y with x's shape, in output_dtype."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtfuse.contract import RMS_NORM
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class RmsNormPlugin(NormPlugin):
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (weight + weight_offset), per contract.WeightMode."""

    OP = RMS_NORM

    def _make_kernel(self, dtype: str, weight_dtype: str | None) -> Any:
        kernels = self._kernels()
        spec = kernels.RmsNormSpec(
            hidden=self.config.hidden_sizes[0], quant=self.config.quant, **self._spec_fields(dtype, weight_dtype)
        )
        return kernels.get_rms_norm(spec)

    def enqueue(
        self,
        input_desc: Sequence[Any],
        output_desc: Sequence[Any],
        inputs: Sequence[int],
        outputs: Sequence[int],
        workspace: int,
        stream: int,
    ) -> None:
        self._launch(inputs[0], inputs[1] if self._weighted else 0, outputs[0], self._rows[0], stream)


class RmsNormPluginCreator(NormPluginCreator):
    PLUGIN = RmsNormPlugin
