"""Is a QuantizeLinear/DequantizeLinear pair inside an RMSNorm within the model's own quantization noise?

A fused node cannot quantize in the middle of its chain, so fusing through a Q/DQ pair would drop it. trtfuse no longer
does (such norms stay unfused, docs/patterns.md): this is the measurement of the rule it used to apply, kept because it
shows what the rounding alone changes, not the clipping. It measures what dropping changes, the way ModelOpt calibrates
(per-tensor int8 or float8 e4m3, scale from the calibration maximum): activations with per-row scales spread over two
decades (the rows whose rms, and so rsqrt, differ most), a weight, and the Q/DQ on the norm's output that feeds the next
MatMul (which stays after the fused node). For each place of the inner pair (on rsqrt, on the x the normalising Mul
reads, on the normalised value before the weight) it reports, as rms and max of the error over the rms of the float
output (max over elements at least 1% of the largest):
    original    the quantized graph against the float evaluation of the same arithmetic (the model's own noise)
    fused       the graph with the inner pair dropped (its output Q/DQ kept) against the same float evaluation
    difference  fused against original
Run: python3 benchmarks/qdq_inside_norm.py [--rows 2048] [--hidden 1024] [--seed 0]
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

INT8_MAX = 127.0
E4M3_MAX = 448.0


def quantize_dequantize(values: np.ndarray, kind: str, scale: float) -> np.ndarray:
    """DequantizeLinear(QuantizeLinear(values)) with a per-tensor scale and zero point 0, as onnxruntime computes."""
    if kind == "int8":
        return np.clip(np.rint(values / scale), -128, INT8_MAX) * scale
    # QuantizeLinear saturates to float8's largest finite value (saturate=1, the default).
    scaled = np.clip(values / scale, -E4M3_MAX, E4M3_MAX)
    return scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale


def calibrated(values: np.ndarray, kind: str) -> float:
    """Max calibration: the scale that maps the largest magnitude onto the format's largest value."""
    return float(np.abs(values).max()) / (INT8_MAX if kind == "int8" else E4M3_MAX)


def measure(rows: int, hidden: int, seed: int, kind: str, place: str) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, hidden)) * np.exp(rng.uniform(np.log(0.1), np.log(10.0), (rows, 1)))
    weight = rng.uniform(0.5, 1.5, hidden)
    inverse = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    normalized = x * inverse
    float_out = normalized * weight
    if place == "rsqrt":
        quantized_out = x * quantize_dequantize(inverse, kind, calibrated(inverse, kind)) * weight
    elif place == "x":
        quantized_out = quantize_dequantize(x, kind, calibrated(x, kind)) * inverse * weight
    else:
        quantized_out = quantize_dequantize(normalized, kind, calibrated(normalized, kind)) * weight
    out_scale = calibrated(float_out, kind)

    def output(values: np.ndarray) -> np.ndarray:
        return quantize_dequantize(values, kind, out_scale)

    original, fused = output(quantized_out), output(float_out)
    scale = np.sqrt(np.mean(float_out**2))
    large = np.abs(float_out) >= 0.01 * np.abs(float_out).max()
    errors = {
        "original": np.abs(original - float_out),
        "fused": np.abs(fused - float_out),
        "difference": np.abs(fused - original),
    }
    result = {f"{name} rms": float(np.sqrt(np.mean(value**2)) / scale) for name, value in errors.items()}
    result.update(
        {f"{name} max": float(np.max(value[large] / np.abs(float_out[large]))) for name, value in errors.items()}
    )
    result["changed"] = float(np.mean(errors["difference"] > 0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("format place       original rms / max   fused rms / max   difference rms / max   outputs changed")
    for kind in ("int8", "fp8"):
        for place in ("rsqrt", "x", "normalized"):
            r = measure(args.rows, args.hidden, args.seed, kind, place)
            print(
                f"{kind:6} {place:10}   {r['original rms']:.2e} / {r['original max']:.2e}"
                f"   {r['fused rms']:.2e} / {r['fused max']:.2e}"
                f"   {r['difference rms']:.2e} / {r['difference max']:.2e}   {r['changed']:6.1%}"
            )


if __name__ == "__main__":
    main()
