"""TrtfuseQkNorm: inputs (q, k, q_weight, k_weight), or (q, k) when weight_mode is NONE; outputs (q_out, k_out).

q and k share one dtype, q_out and k_out one output_dtype, and both one epsilon / weight_offset / weight_mode; each
is normalised over its own last axis (q_hidden_size, k_hidden_size) with its own weight, both in one kernel launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtfuse.contract import QK_NORM
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator


class QkNormPlugin(NormPlugin):
    """The q-norm and k-norm of one attention block: two RMSNorms with shared constants, one launch."""

    OP = QK_NORM

    def _make_kernel(self, dtype: str, weight_dtype: str | None) -> Any:
        kernels = self._kernels()
        q_hidden, k_hidden = self.config.hidden_sizes
        spec = kernels.QkNormSpec(q_hidden=q_hidden, k_hidden=k_hidden, **self._spec_fields(dtype, weight_dtype))
        return kernels.get_qk_norm(spec)

    def enqueue(
        self,
        input_desc: Sequence[Any],
        output_desc: Sequence[Any],
        inputs: Sequence[int],
        outputs: Sequence[int],
        workspace: int,
        stream: int,
    ) -> None:
        weighted = self._weighted
        q_rows, k_rows = self._rows
        self._launch(
            inputs[0],
            inputs[1],
            inputs[2] if weighted else 0,
            inputs[3] if weighted else 0,
            outputs[0],
            outputs[1],
            q_rows,
            k_rows,
            stream,
        )


class QkNormPluginCreator(NormPluginCreator):
    PLUGIN = QkNormPlugin
