"""Tiling sweep for the prefill RMSNorm on a GPU: every candidate tiling of a shape, timed side by side in one run.

    python3 benchmarks/kernel_sweep.py [--json PATH] [--reps N] [--only SHAPE ...]

Same method as `python -m trtfuse.bench.kernels` (its helpers are reused): the 1 GiB device-to-device copy of the same
run is the ceiling; each number is the median of event-timed calls over rotating, freshly drawn input sets, outputs
NaN-poisoned and checked against torch. Each candidate is timed `--reps` times, interleaved with the others, so that
run-to-run drift shows up as spread rather than as a difference between candidates. The launch floor is an
event-timed no-op launch (0 rows, one block): the fixed cost every timed call carries, whatever its size.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.kernels import (
    EPS,
    check_close,
    copy_bandwidth_gbs,
    fresh_compile,
    input_sets,
    launch_floor_us,
    median_event_us,
    same_size_copy_us,
)
from trtfuse.bench.reference import norm_reference
from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import RmsNormVariant
from trtfuse.kernels.device import current_device
from trtfuse.kernels.specs import RmsNormSpec
from trtfuse.kernels.tiling import Regime, RowTiling, full_vector, gpu_table, row_tiling

AFTER, BEFORE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST
PAIRS_16 = (("bfloat16", "bfloat16", AFTER), ("float16", "float16", AFTER))
PAIRS_MIXED = (("bfloat16", "float32", BEFORE),)
# (rows, hidden) -> (x, weight, mode) dtype pairs.
SHAPES: dict[tuple[int, int], tuple[tuple[str, str, WeightMode], ...]] = {
    (16384, 4096): PAIRS_16 + PAIRS_MIXED,
    (8192, 8192): PAIRS_16 + PAIRS_MIXED,
    (16384, 2048): PAIRS_16,
    (4096, 4096): PAIRS_16,
    (16384, 5120): PAIRS_16[:1],
}
# hidden -> candidates beyond the table's own choice: RowTiling fields (threads per row; rows per block, 1 unless
# given; the rest off unless given). Here: x held in registers (the first session's table) and a 512-thread reread.
CANDIDATES: dict[int, tuple[dict[str, Any], ...]] = {
    4096: (
        {"threads": 256, "floor": 6},
        {"threads": 256, "reread": True},
        {"threads": 128, "reread": True},
        {"threads": 128},
        {"threads": 512, "reread": True},
        {"threads": 512},
    ),
    8192: ({"threads": 256}, {"threads": 512, "reread": True, "floor": 4}),
    2048: (
        {"threads": 128},
        {"threads": 64, "reread": True},
        {"threads": 256},
        {"threads": 256, "reread": True},
        {"threads": 128, "rows": 2, "reread": True},
        {"threads": 64, "rows": 2, "reread": True},
    ),
    5120: ({"threads": 256},),
}


def candidate_tiling(
    hidden: int, vector: int, threads: int, rows: int = 1, floor: int = 0, reread: bool = False
) -> RowTiling:
    return RowTiling(
        hidden=hidden,
        vector=vector,
        threads_per_row=threads,
        vectors_per_thread=-(-(hidden // vector) // threads),
        rows_per_block=rows,
        min_blocks_per_sm=floor,
        reread=reread,
    )


def label(t: RowTiling) -> str:
    reread = "r" if t.reread else ""
    return f"T{t.threads_per_row}K{t.vectors_per_thread}v{t.vector}R{t.rows_per_block}m{t.min_blocks_per_sm}{reread}"


def time_candidates(
    rows: int, hidden: int, pair: tuple[str, str, WeightMode], reps: int, copy: float, cache: KernelCache
) -> list[dict[str, Any]]:
    """Every candidate tiling of one shape and dtype pair, plus torch.compile and a same-size copy, `reps` times."""
    name, wname, mode = pair
    dtype, wdtype = getattr(torch, name), getattr(torch, wname)
    vector = full_vector(hidden, dtype.itemsize)
    spec = RmsNormSpec(hidden, name, wname, NormParams(EPS, 0.0, mode))
    tilings = [row_tiling(hidden, vector, Regime.PREFILL, dtype.itemsize, table=gpu_table(current_device().name))]
    tilings += [candidate_tiling(hidden, vector, **c) for c in CANDIDATES.get(hidden, ())]
    nbytes = 2 * rows * hidden * dtype.itemsize + hidden * wdtype.itemsize
    n_sets = input_sets(nbytes)
    xs = [torch.randn(rows, hidden, device="cuda", dtype=dtype) for _ in range(n_sets)]
    ys = [torch.full_like(xs[0], float("nan")) for _ in range(n_sets)]
    w = torch.randn(hidden, device="cuda", dtype=wdtype)
    ref = norm_reference(xs[0], w, NormParams(EPS, 0.0, mode))
    stream = torch.cuda.current_stream().cuda_stream
    calls: dict[str, Any] = {}
    for t in tilings:
        fn = cache.get(RmsNormVariant(spec, t, current_device().arch))
        calls[label(t)] = lambda i, fn=fn: fn(xs[i].data_ptr(), w.data_ptr(), ys[i].data_ptr(), rows, stream)
    if mode is AFTER and wname == name:
        compiled = fresh_compile()
        calls["torch.compile"] = lambda i: compiled(xs[i], w)
    timed: dict[str, list[float]] = {key: [] for key in [*calls, "same-size copy"]}
    for rep in range(reps):
        for key, call in calls.items():
            timed[key].append(median_event_us(call, n_sets))
            if rep == 0 and key != "torch.compile":
                check_close(ys[0], ref, f"{rows}x{hidden} {name} {key}")
                ys[0].fill_(float("nan"))
        timed["same-size copy"].append(same_size_copy_us(nbytes))
    print(f"{rows}x{hidden} {name}/{wname} {mode.name}:", flush=True)
    results = []
    for key, values in timed.items():
        pcts = [100 * nbytes / us / 1e3 / copy for us in values]
        print(f"  {key:>18}: " + "  ".join(f"{us:6.2f} µs {p:5.1f}%" for us, p in zip(values, pcts, strict=True)))
        results.append(
            {
                "shape": f"{rows}x{hidden}",
                "dtype": name,
                "weight_dtype": wname,
                "mode": mode.name,
                "candidate": key,
                "us": values,
                "pct_copy": pcts,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="shapes as ROWSxHIDDEN")
    args = parser.parse_args()
    cache = KernelCache(Path(tempfile.mkdtemp()))
    copy = copy_bandwidth_gbs()
    floor = launch_floor_us()
    print(f"copy ceiling {copy:.0f} GB/s; event-timed no-op launch {floor:.2f} µs", flush=True)
    results = []
    for (rows, hidden), pairs in SHAPES.items():
        if args.only and f"{rows}x{hidden}" not in args.only:
            continue
        for pair in pairs:
            results += time_candidates(rows, hidden, pair, args.reps, copy, cache)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"copy_gbs": copy, "launch_floor_us": floor, "results": results}, indent=1))


if __name__ == "__main__":
    main()
