"""The contract's semantics (trtfuse/contract.py, WeightMode) in float64 torch: the one reference every harness and
GPU test checks the kernels and plugins against."""

from __future__ import annotations

import torch

from trtfuse.contract import NormParams, WeightMode, rounding_dtype


def norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    params: NormParams,
    output_dtype: str | None = None,
) -> torch.Tensor:
    """y for x over its last axis, computed in float64 on x's device, with the casts where the weight mode puts
    them: to the output dtype T (`output_dtype`, default x's) at the end and, in AFTER_CAST, to the node's 16-bit
    dtype R before the weight multiply. `weight` is unused in WeightMode.NONE."""
    x_name = str(x.dtype).removeprefix("torch.")
    out_name = output_dtype or x_name
    out, rounding = getattr(torch, out_name), getattr(torch, rounding_dtype(x_name, out_name))
    x64 = x.detach().double()
    normed = x64 * (x64.pow(2).mean(dim=-1, keepdim=True) + params.epsilon).rsqrt()
    if params.weight_mode is WeightMode.NONE:
        return normed.to(out)
    if weight is None:
        raise ValueError(f"the reference of a {params.weight_mode.name} norm needs a weight")
    scale = weight.detach().double() + params.weight_offset
    if params.weight_mode is WeightMode.AFTER_CAST:
        return (normed.to(rounding).double() * scale).to(out)
    return (normed * scale).to(out)


def add_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    params: NormParams,
    output_dtype: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) of the fused residual add+norm: h = D(x + residual), the sum in float32 rounded once to x's dtype D
    (the contract's definition; for 16-bit D the correctly rounded sum), then y = `norm_reference` of the rounded h."""
    h = (x.detach().float() + residual.detach().float()).to(x.dtype)
    return norm_reference(h, weight, params, output_dtype), h
