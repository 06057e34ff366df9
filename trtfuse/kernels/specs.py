"""What a norm kernel computes: the compile-time half of a plugin node's attributes."""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass

from trtfuse.contract import (
    ACTIVATION_DTYPES,
    QUANT_DTYPE_CODES,
    WEIGHT_DTYPES,
    NormParams,
    QuantParams,
    WeightMode,
    dtype_pair_problem,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def _check_common(dtype: str, out_dtype: str, weight_dtype: str | None, params: NormParams) -> None:
    if dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype {dtype!r} is not one of {ACTIVATION_DTYPES}")
    problem = dtype_pair_problem(dtype, out_dtype)
    if problem is not None:
        raise ValueError(problem)
    if params.weight_mode is WeightMode.NONE:
        if weight_dtype is not None:
            raise ValueError("weight_mode NONE takes no weight, but weight_dtype is set")
    elif weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype {weight_dtype!r} is not one of {WEIGHT_DTYPES}")
    if not params.epsilon >= 0.0:
        raise ValueError(f"epsilon must be a non-negative number, got {params.epsilon!r}")


def _check_hidden(name: str, hidden: int) -> None:
    if not isinstance(hidden, int) or hidden <= 0:
        raise ValueError(f"{name} must be a positive int, got {hidden!r}")


def _normalise(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> None:
    if spec.out_dtype is None:
        object.__setattr__(spec, "out_dtype", spec.dtype)
    _check_common(spec.dtype, spec.out_dtype, spec.weight_dtype, spec.params)


def _check_quant(quant: QuantParams | None) -> None:
    """The quantizers a kernel can compile: the contract's (docs/plugin-nodes.md, "Quantization")."""
    if quant is None:
        return
    if not quant.stages:
        raise ValueError("quant has every stage off: use quant=None for a plain kernel")
    for stage in quant.stages:
        quantizer = quant.at(stage)
        if quantizer.dtype not in QUANT_DTYPE_CODES:
            raise ValueError(
                f"{stage.value} quantizer dtype {quantizer.dtype!r} is not one of {tuple(QUANT_DTYPE_CODES)}"
            )
        scale = quantizer.scale
        if not (math.isfinite(scale) and scale > 0.0 and struct.unpack("f", struct.pack("f", scale))[0] == scale):
            raise ValueError(f"{stage.value} quantizer scale {scale!r} is not a positive finite float32 value")
        if quantizer.dtype == "int8" and not quantizer.saturate:
            raise ValueError(f"{stage.value} quantizer: INT8 always saturates, saturate=False is not a quantizer")
        float_dtypes = (
            ("dequant", quantizer.dequant_dtype, stage.fake, "a dequant dtype exactly for the fake-quant stages"),
            ("input", quantizer.input_dtype, stage.rounds_input, "an input dtype exactly for the rsqrt stage"),
        )
        for name, dtype, has_it, rule in float_dtypes:
            if has_it != (dtype is not None):
                raise ValueError(f"{stage.value} quantizer: {rule}")
            if has_it and dtype not in ACTIVATION_DTYPES:
                raise ValueError(f"{stage.value} {name} dtype {dtype!r} is not one of {ACTIVATION_DTYPES}")


def _repr(spec: RmsNormSpec | AddRmsNormSpec) -> str:
    """The dataclass repr, with `quant` only when set: a plain spec's repr (the compile cache's and the AOT entry
    names' key) stays what it was before quantizers, so plain kernels keep their PTX byte for byte."""
    fields = [f for f in dataclasses.fields(spec) if f.name != "quant" or spec.quant is not None]
    return f"{type(spec).__qualname__}({', '.join(f'{f.name}={getattr(spec, f.name)!r}' for f in fields)})"


def has_fp8_stage(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> bool:
    """Whether a stage of `spec` quantizes to FP8, whose conversion (cvt...e4m3x2) needs sm_89 or newer."""
    quant = getattr(spec, "quant", None)
    return quant is not None and any(quant.at(stage).dtype == "float8_e4m3fn" for stage in quant.stages)


def _y_dtype(spec: RmsNormSpec | AddRmsNormSpec) -> str:
    output = None if spec.quant is None else spec.quant.output
    return spec.out_dtype if output is None else output.dtype


@dataclass(frozen=True, repr=False)
class RmsNormSpec:
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (w + weight_offset) over rows of `hidden` elements, per `params`.

    `dtype` is x's, `out_dtype` the normalised value's T (None: x's), as the contract's pairs allow. `quant` (None:
    none) holds the quantizer stages, compile-time constants as epsilon is: x fake-quantized before the norm reads
    it, r per row, and y quantized after its rounding to T, so that y is stored in `y_dtype`."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("hidden", self.hidden)
        _normalise(self)
        _check_quant(self.quant)

    __repr__ = _repr

    @property
    def y_dtype(self) -> str:
        """The dtype y is stored in: the output quantizer's when that stage is on, else T."""
        return _y_dtype(self)


@dataclass(frozen=True, repr=False)
class AddRmsNormSpec:
    """The fused residual add+RMSNorm: h = D(x + residual), rounded once to D = `dtype`, and y = the RMSNorm of h
    (exactly `RmsNormSpec`'s with h as its x, its quantizers included: the input stage fake-quantizes h for the
    norm, h itself is output as it is). x, residual and h are D, y is `y_dtype` (T = `out_dtype`, None: D)."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("hidden", self.hidden)
        _normalise(self)
        _check_quant(self.quant)

    __repr__ = _repr

    @property
    def y_dtype(self) -> str:
        return _y_dtype(self)

    def norm(self) -> RmsNormSpec:
        """The RMSNorm of h this computes (the same fields)."""
        return RmsNormSpec(self.hidden, self.dtype, self.weight_dtype, self.params, self.out_dtype, self.quant)


@dataclass(frozen=True)
class QkNormSpec:
    """Two RMSNorms in one launch: q rows of `q_hidden` and k rows of `k_hidden`, each with its own weight."""

    q_hidden: int
    k_hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None  # q_out's and k_out's; None: q's and k's

    def __post_init__(self) -> None:
        _check_hidden("q_hidden", self.q_hidden)
        _check_hidden("k_hidden", self.k_hidden)
        _normalise(self)
