"""What a norm kernel computes: the compile-time half of a plugin node's attributes."""

from __future__ import annotations

from dataclasses import dataclass

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES, WeightMode

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _check_common(dtype: str, weight_dtype: str | None, epsilon: float, weight_mode: WeightMode) -> None:
    if dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype {dtype!r} is not one of {ACTIVATION_DTYPES}")
    if WeightMode(weight_mode) is WeightMode.NONE:
        if weight_dtype is not None:
            raise ValueError("weight_mode NONE takes no weight, but weight_dtype is set")
    elif weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype {weight_dtype!r} is not one of {WEIGHT_DTYPES}")
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be a non-negative number, got {epsilon!r}")


def _check_hidden(name: str, hidden: int) -> None:
    if not isinstance(hidden, int) or hidden <= 0:
        raise ValueError(f"{name} must be a positive int, got {hidden!r}")


@dataclass(frozen=True)
class RmsNormSpec:
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (w + weight_offset) over rows of `hidden` elements."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    epsilon: float
    weight_offset: float
    weight_mode: WeightMode

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_mode", WeightMode(self.weight_mode))
        _check_hidden("hidden", self.hidden)
        _check_common(self.dtype, self.weight_dtype, self.epsilon, self.weight_mode)


@dataclass(frozen=True)
class QkNormSpec:
    """Two RMSNorms in one launch: q rows of `q_hidden` and k rows of `k_hidden`, each with its own weight."""

    q_hidden: int
    k_hidden: int
    dtype: str
    weight_dtype: str | None
    epsilon: float
    weight_offset: float
    weight_mode: WeightMode

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_mode", WeightMode(self.weight_mode))
        _check_hidden("q_hidden", self.q_hidden)
        _check_hidden("k_hidden", self.k_hidden)
        _check_common(self.dtype, self.weight_dtype, self.epsilon, self.weight_mode)
