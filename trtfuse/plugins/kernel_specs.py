"""What both plugin kinds ask trtfuse.kernels for: each op's kernel names (a quantized op's are its plain op's, as it
runs its plain op's kernel with quantizers), and a node's kernel spec for one (activation, weight) dtype pair (and a
rotary op's table dtype).

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
    contract.QK_NORM_ROPE_OP: KernelNames(
        "QkNormRopeSpec", "get_qk_norm_rope", "qk_norm_rope_artifact", "qk_norm_rope_tactics"
    ),
}
# The kernels' names of the contract's rotations and head layouts (`kernels.specs.RopeParams`).
_ROTATIONS = {contract.Rotation.HALF_SPLIT: "half", contract.Rotation.INTERLEAVED: "interleaved"}
_LAYOUTS = {contract.HeadLayout.TOKEN_MAJOR: "token_major", contract.HeadLayout.HEAD_MAJOR: "head_major"}


def kernel_names(op: contract.FusedOp) -> KernelNames:
    return _NAMES[op.base or op.name]


def kernel_spec(fields: NodeFields, dtype: str, weight_dtype: str | None, table_dtype: str | None = None) -> Any:
    """The spec of the node's kernel for activations of `dtype` and weights of `weight_dtype` (None for weight_mode
    NONE): its hidden sizes, constants and output dtype T, a quantized op's quantizers, and a rotary op's rotation
    with its cos and sin tables' dtype `table_dtype`."""
    from trtfuse.kernels import specs

    spec_class = getattr(specs, kernel_names(fields.op).spec)
    extra: dict[str, Any] = {} if fields.quant is None else {"quant": fields.quant}
    rotary = fields.rotary
    if rotary is not None:
        layouts = (_LAYOUTS[rotary.layout], _LAYOUTS[rotary.output_layout])
        rope = (rotary.head_dim, rotary.rotary_dim, _ROTATIONS[rotary.rotation], *layouts)
        extra.update(rope=specs.RopeParams(*rope), cos_dtype=table_dtype)
    return spec_class(*fields.hidden_sizes, dtype, weight_dtype, fields.params, fields.output_dtype, **extra)
