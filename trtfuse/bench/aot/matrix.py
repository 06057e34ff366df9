"""The spec x tactic matrix: what the CPU compile test compiles and the GPU check launches."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec


@dataclass(frozen=True)
class MatrixEntry:
    """One spec to compile and check; `heads` (q, k) per token for QK-norm, None for RMSNorm."""

    spec: RmsNormSpec | QkNormSpec
    heads: tuple[int, int] | None = None


def matrix() -> list[MatrixEntry]:
    """Every spec of tests/gpu/test_kernels_gpu.py (dtype pairs and modes, hidden sizes, prefill re-reads, unaligned
    pointers, mixed precision, the CUDA-graph specs; QK-norm with its head counts), each once."""
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    dtypes = ("float32", "float16", "bfloat16")
    hiddens = (64, 128, 1000, 2048, 4096, 5120, 8192)
    mixed_pairs = (("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"))

    def sixteen_bit(dtype: str, out: str) -> str:
        return dtype if dtype != "float32" else out

    rms = [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode))
        for act, wdt in itertools.product(dtypes, dtypes)
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none)) for act in dtypes]
    rms += [
        RmsNormSpec(hidden, dtype, wdt, NormParams(1e-6, offset, mode))
        for hidden in hiddens
        for dtype, wdt, offset, mode in (
            ("bfloat16", "bfloat16", 0.0, after),
            ("float16", "float32", 1.0, before),
            ("float32", "bfloat16", 1.0, after),
        )
    ]
    rms += [
        RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 1.0, before)),
        RmsNormSpec(8192, "bfloat16", "float16", NormParams(1e-5, 0.0, after)),
        RmsNormSpec(8192, "float16", None, NormParams(1e-6, 0.0, none)),
        RmsNormSpec(5120, "float16", "float16", NormParams(1e-6, 1.0, after)),
        RmsNormSpec(3000, "bfloat16", None, NormParams(1e-6, 0.0, none)),
    ]
    rms += [RmsNormSpec(hidden, "bfloat16", "float32", NormParams(1e-6, 0.0, after)) for hidden in (1001, 4096)]
    rms += [RmsNormSpec(4096, "float16", "float32", NormParams(3e-6, 0.0, after))]
    rms += [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode), out)
        for act, out in mixed_pairs
        for wdt in ("float32", sixteen_bit(act, out))
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none), out) for act, out in mixed_pairs]
    rms += [
        RmsNormSpec(hidden, dtype, sixteen_bit(dtype, out), NormParams(1e-6, 0.0, after), out)
        for hidden in (*hiddens, 1004, 1001)
        for dtype, out in (("float32", "bfloat16"), ("bfloat16", "float32"))
    ]
    rms += [
        RmsNormSpec(4096, dtype, "float32", NormParams(1e-6, 0.0, after), out)
        for dtype, out in (("float32", "float16"), ("float16", "float32"))
    ]
    rms += [RmsNormSpec(4096, "float32", "bfloat16", NormParams(7e-6, 0.0, after), "bfloat16")]
    qk = [
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before)), (8, 4)),
        (QkNormSpec(64, 64, "float16", "float16", NormParams(1e-5, 0.0, after)), (16, 16)),
        (QkNormSpec(128, 128, "float32", None, NormParams(1e-6, 0.0, none)), (8, 2)),
        (QkNormSpec(4096, 1024, "bfloat16", "float32", NormParams(1e-6, 0.0, before)), (1, 1)),
        (QkNormSpec(8192, 5120, "float16", "float16", NormParams(1e-6, 1.0, after)), (1, 1)),
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(128, 128, "float32", "bfloat16", NormParams(1e-6, 0.0, after), "bfloat16"), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before), "float32"), (32, 8)),
        (QkNormSpec(4096, 1024, "float16", "float32", NormParams(1e-6, 0.0, after), "float32"), (1, 1)),
    ]
    entries = [MatrixEntry(spec) for spec in rms] + [MatrixEntry(spec, heads) for spec, heads in qk]
    return list(dict.fromkeys(entries))


def entry_name(entry: MatrixEntry) -> str:
    """A readable file-name stem for an entry (unique together with its index in the manifest)."""
    spec = entry.spec
    params = spec.params
    size = f"h{spec.hidden}" if entry.heads is None else f"q{spec.q_hidden}k{spec.k_hidden}"
    kind = "rms" if entry.heads is None else "qk"
    weight = spec.weight_dtype or "noweight"
    mode = params.weight_mode.name.lower()
    return (
        f"{kind}-{size}-{spec.dtype}-{weight}-{spec.out_dtype}-{mode}-eps{params.epsilon:g}-off{params.weight_offset:g}"
    )


def part_rows(entry: MatrixEntry, tokens: int) -> tuple[int, ...]:
    """Each row part's row count for `tokens` tokens: the rows themselves, or tokens x (q heads, k heads)."""
    if entry.heads is None:
        return (tokens,)
    return tuple(tokens * heads for heads in entry.heads)


def part_hidden(entry: MatrixEntry) -> tuple[int, ...]:
    spec = entry.spec
    return (spec.hidden,) if entry.heads is None else (spec.q_hidden, spec.k_hidden)
