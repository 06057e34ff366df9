"""What both plugin kinds read off a rotary node's shapes: the contract's rule (`contract.rotary_shapes`), which
`check` holds a fused model to as well."""

from trtfuse.contract.rotary_shapes import TOKEN_AXIS, rotary_extents

__all__ = ["TOKEN_AXIS", "rotary_extents"]
