"""What a norm kernel computes: the compile-time half of a plugin node's attributes."""

from __future__ import annotations

from dataclasses import dataclass

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES, NormParams, QuantParams, WeightMode, dtype_pair_problem

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


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


@dataclass(frozen=True)
class RmsNormSpec:
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (w + weight_offset) over rows of `hidden` elements, per `params`.

    `dtype` is x's, `out_dtype` y's (None: x's), as the contract's pairs allow."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("hidden", self.hidden)
        _normalise(self)


@dataclass(frozen=True)
class AddRmsNormSpec:
    """The fused residual add+RMSNorm: h = D(x + residual), rounded once to D = `dtype`, and y = the RMSNorm of h
    (exactly `RmsNormSpec`'s with h as its x). x, residual and h are D, y is `out_dtype` (None: D)."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("hidden", self.hidden)
        _normalise(self)

    def norm(self) -> RmsNormSpec:
        """The RMSNorm of h this computes (the same fields)."""
        return RmsNormSpec(self.hidden, self.dtype, self.weight_dtype, self.params, self.out_dtype)


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
