"""What both plugin kinds ask trtfuse.kernels for: each op's kernel names (a quantized op's are its plain op's, as it
runs its plain op's kernel with quantizers), and a node's kernel spec for one (activation, weight) dtype pair.

Importing this module needs no CuTeDSL: `kernel_spec` imports `trtfuse.kernels.specs`, which needs none either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtfuse import contract
from trtfuse.contract.codec import NodeFields


@dataclass(frozen=True)
class KernelNames:
    """An op's names in trtfuse.kernels: its spec class (`kernels.specs`), its JIT factory (`kernels`), and its AOT
    artifact builder and tactics (`kernels.artifacts`)."""

    spec: str
    jit: str
    artifact: str
    tactics: str


_NAMES = {
    contract.RMS_NORM_OP: KernelNames("RmsNormSpec", "get_rms_norm", "rms_norm_artifact", "rms_norm_tactics"),
    contract.QK_NORM_OP: KernelNames("QkNormSpec", "get_qk_norm", "qk_norm_artifact", "qk_norm_tactics"),
    contract.ADD_RMS_NORM_OP: KernelNames(
        "AddRmsNormSpec", "get_add_rms_norm", "add_rms_norm_artifact", "add_rms_norm_tactics"
    ),
}


def kernel_names(op: contract.FusedOp) -> KernelNames:
    return _NAMES[op.base or op.name]


def kernel_spec(fields: NodeFields, dtype: str, weight_dtype: str | None) -> Any:
    """The spec of the node's kernel for activations of `dtype` and weights of `weight_dtype` (None for weight_mode
    NONE): its hidden sizes, constants and output dtype T, and a quantized op's quantizers."""
    from trtfuse.kernels import specs

    spec_class = getattr(specs, kernel_names(fields.op).spec)
    quant = {} if fields.quant is None else {"quant": fields.quant}
    return spec_class(*fields.hidden_sizes, dtype, weight_dtype, fields.params, fields.output_dtype, **quant)
