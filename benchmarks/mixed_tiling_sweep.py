"""Tiling sweep for mixed-precision prefill RMSNorm (x and y of different widths) on a GPU, candidates side by side.

    PYTHONPATH=. python3 benchmarks/mixed_tiling_sweep.py [--reps N] [--json PATH]

Same method as `python -m trtfuse.bench.kernels`: the same run's 1 GiB device-to-device copy is the ceiling; each
number is the median of event-timed calls over rotating input sets (3x the L2), outputs NaN-poisoned and checked.
Bytes: x read, y written, the weight read once. Candidates (T threads per row, K vectors of 8 per thread, m blocks per
SM floor, r x read twice, p paired stores for an fp32 y) are interleaved `--reps` times so drift shows as spread, not
as a difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.kernels import EPS, check_close, copy_bandwidth_gbs, input_sets, median_event_us
from trtfuse.bench.reference import norm_reference
from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import RmsNormVariant
from trtfuse.kernels.device import current_device
from trtfuse.kernels.specs import RmsNormSpec
from trtfuse.kernels.tiling import Regime, RowTiling, row_tiling

PAIRS = (("float32", "bfloat16"), ("bfloat16", "float32"))
SHAPES = ((16384, 4096), (8192, 8192))
VECTOR = 8
# (threads per row, min blocks per SM, reread) beyond the table's own choice.
CANDIDATES = ((256, 0, False), (256, 6, False), (128, 0, False), (512, 0, False), (256, 0, True), (512, 0, True))


def tiling(hidden: int, threads: int, floor: int, reread: bool, paired: bool) -> RowTiling:
    vectors = hidden // VECTOR
    return RowTiling(hidden, VECTOR, threads, -(-vectors // threads), max(1, 128 // threads), floor, reread, paired)


def label(t: RowTiling) -> str:
    flags = ("r" if t.reread else "") + ("p" if t.paired_stores else "")
    return f"T{t.threads_per_row}K{t.vectors_per_thread}m{t.min_blocks_per_sm}{flags}"


def sweep(x_name: str, y_name: str, rows: int, hidden: int, reps: int, copy: float, cache: KernelCache) -> list[dict]:
    x_dtype, y_dtype = getattr(torch, x_name), getattr(torch, y_name)
    spec = RmsNormSpec(hidden, x_name, y_name, NormParams(EPS, 0.0, WeightMode.AFTER_CAST), y_name)
    table = row_tiling(hidden, VECTOR, Regime.PREFILL, x_dtype.itemsize, y_dtype.itemsize)
    tilings = {label(table) + " (table)": table}
    paired = table.paired_stores
    for threads, floor, reread in CANDIDATES:
        if reread and x_dtype.itemsize != 2:
            continue
        for pairing in {paired, False}:
            t = tiling(hidden, threads, floor, reread, pairing)
            tilings.setdefault(label(t), t)
    nbytes = rows * hidden * (x_dtype.itemsize + y_dtype.itemsize) + hidden * y_dtype.itemsize
    n_sets = input_sets(nbytes)
    xs = [torch.randn(rows, hidden, device="cuda", dtype=x_dtype) for _ in range(n_sets)]
    ys = [torch.full((rows, hidden), float("nan"), device="cuda", dtype=y_dtype) for _ in range(n_sets)]
    w = torch.randn(hidden, device="cuda", dtype=y_dtype)
    ref = norm_reference(xs[0], w, NormParams(EPS, 0.0, WeightMode.AFTER_CAST), y_name)
    stream = torch.cuda.current_stream().cuda_stream
    calls: dict[str, Any] = {}
    for key, t in tilings.items():
        fn = cache.get(RmsNormVariant(spec, t, current_device().arch))
        calls[key] = lambda i, fn=fn: fn(xs[i].data_ptr(), w.data_ptr(), ys[i].data_ptr(), rows, stream)
    timed: dict[str, list[float]] = {key: [] for key in calls}
    for rep in range(reps):
        for key, call in calls.items():
            timed[key].append(median_event_us(call, n_sets))
            if rep == 0:
                check_close(ys[0], ref, f"{rows}x{hidden} {x_name}->{y_name} {key}")
                ys[0].fill_(float("nan"))
    print(f"{rows}x{hidden} {x_name}->{y_name}:", flush=True)
    results = []
    for key, values in timed.items():
        pcts = [100 * nbytes / us / 1e3 / copy for us in values]
        print(f"  {key:>18}: " + "  ".join(f"{us:6.2f} µs {p:5.1f}%" for us, p in zip(values, pcts, strict=True)))
        results.append({"shape": f"{rows}x{hidden}", "pair": f"{x_name}->{y_name}", "candidate": key, "pct": pcts})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    cache = KernelCache(Path(tempfile.mkdtemp()))
    copy = copy_bandwidth_gbs()
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    results = []
    for x_name, y_name in PAIRS:
        for rows, hidden in SHAPES:
            results += sweep(x_name, y_name, rows, hidden, args.reps, copy, cache)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"copy_gbs": copy, "results": results}, indent=1))


if __name__ == "__main__":
    main()
