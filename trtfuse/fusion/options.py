"""What a caller chooses about the fusion, in model terms; the CLI and the Polygraphy loader spell it as flags."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FusionOptions:
    """`fuse_residual`: the residual Add in front of a norm and that norm become one TrtfuseAddRmsNorm (the default).
    False leaves every Add outside and fuses the norm alone as TrtfuseRmsNorm, the output exactly what the pass wrote
    before the add-norm existed: for a TensorRT build that folds the residual Add into the preceding GEMM's epilogue,
    where that is as fast or faster (docs/performance.md, "Layer tail").

    `fuse_quant`: the QuantizeLinear (-> DequantizeLinear) pairs around a norm (its input, its inverse root, the
    QuantizeLinear of its output; a QK-norm's quantizers) go into the fused node, a TrtfuseRmsNormQuant,
    TrtfuseAddRmsNormQuant or TrtfuseQkNormQuant (the default; docs/patterns.md, "Quantized norms"). False leaves
    every pair in the graph, the output exactly what the pass wrote before the quantized ops existed.

    `fuse_qk`: a q-norm and k-norm pair of one attention block becomes one TrtfuseQkNorm (the default). False leaves
    both norms as the graph computes them, for TensorRT to compile on its own.

    `fuse_norm`: a norm fused alone (neither a QK pair nor an add-norm) becomes a TrtfuseRmsNorm (the default).
    False leaves it as the graph computes it, for TensorRT.

    `fuse_rope`: the rotary embedding after a QK-norm pair goes into the pair's node, a TrtfuseQkNormRope (the
    default; docs/patterns.md, "Rotary embedding"). False leaves every rotation in the graph, the output exactly what
    the pass wrote before the rotary op existed.

    `fuse_qk` and `fuse_norm` exist for `compile --never-slower`, which leaves to TensorRT the kinds of node that lose
    to it (docs/engine.md, "Is it faster?"), and for a user who measured the same."""

    fuse_residual: bool = True
    fuse_quant: bool = True
    fuse_qk: bool = True
    fuse_norm: bool = True
    fuse_rope: bool = True


# The options when a caller gives none: every residual Add, quantizer and rotation the contract computes fused.
DEFAULT_FUSION = FusionOptions()
