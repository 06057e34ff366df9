"""Tiling sweep for the fused residual add+RMSNorm on a GPU: does the RMSNorm table still hold with a residual?

    PYTHONPATH=. python3 benchmarks/add_norm_sweep.py [--reps N] [--json PATH] [--only 4096x4096 ...] [--peers]

The residual's read and h's write double a row's bytes, so the choices the RMSNorm table made on bytes in flight and
registers (threads per row, the 40-register cap, reading the row twice) are re-measured here. Same method as
`python -m trtfuse.bench.kernels`: the same run's 1 GiB device-to-device copy is the ceiling; prefill numbers are
medians of event-timed calls over rotating input sets (3x the L2), decode numbers per-call times of CUDA-graph
replays; outputs NaN-poisoned and checked (h bit for bit). Bytes: x and the residual read, y and h written, the
weight once. Candidates (T threads per row, K vectors of 8 per thread, m blocks-per-SM floor, r the row read twice)
are first checked at 1, 3, 133 and 4097 rows, then interleaved `--reps` times, so drift shows as spread, not as a
difference. `--peers` times QuACK's, Liger's and torch.compile's add+RMSNorm (the anchors section's, from their wheels)
in the same interleaved loop, so a candidate is compared with them in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.anchors import load_peers
from trtfuse.bench.kernels import LLAMA, copy_bandwidth_gbs, graph_replay_us, input_sets, median_event_us
from trtfuse.bench.reference import add_norm_reference
from trtfuse.bench.timing import fresh_compile, llama_add_rms_norm
from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.api import load_into_context, rms_norm_tiling
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import AddRmsNormVariant
from trtfuse.kernels.device import current_device
from trtfuse.kernels.specs import AddRmsNormSpec
from trtfuse.kernels.tiling import Regime, RowTiling, gpu_table

VECTOR = 8
GEMMA = NormParams(1e-6, 1.0, WeightMode.BEFORE_CAST)
# (name, spec, rows, candidates): candidates are (threads per row, min blocks per SM, reread) beyond the table's own
# choice. Gemma's mode and an fp32 weight are the rows that spill under the RMSNorm table's 40-register cap.
PREFILL = (
    ("llama-bf16", AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA), 16384,
     ((256, 6, True), (256, 0, False), (256, 6, False), (128, 0, True), (128, 0, False), (512, 0, True),
      (512, 0, False))),
    ("gemma-bf16", AddRmsNormSpec(4096, "bfloat16", "bfloat16", GEMMA), 16384,
     ((256, 6, True), (256, 0, False), (256, 6, False))),
    ("llama-bf16-fp32w", AddRmsNormSpec(4096, "bfloat16", "float32", LLAMA), 16384,
     ((256, 6, True), (256, 0, False), (256, 6, False))),
    ("llama-bf16", AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA), 4096,
     ((256, 6, True), (256, 0, False), (128, 0, True), (128, 0, False), (512, 0, True), (512, 0, False))),
    ("llama-bf16", AddRmsNormSpec(8192, "bfloat16", "bfloat16", LLAMA), 8192,
     ((256, 0, False), (512, 0, True), (512, 3, True), (512, 0, False), (1024, 0, True), (1024, 0, False))),
    ("llama-fp16", AddRmsNormSpec(8192, "float16", "float16", LLAMA), 8192,
     ((512, 0, True), (512, 3, True), (512, 0, False))),
    ("gemma-bf16", AddRmsNormSpec(8192, "bfloat16", "bfloat16", GEMMA), 8192, ((512, 0, True), (512, 0, False))),
)  # fmt: skip
DECODE_ROWS = (1, 32, 128)
DECODE_CANDIDATES = ((128, 0, False), (256, 0, False), (512, 0, False), (64, 0, False), (256, 6, True))
CHECK_ROWS = (1, 3, 133, 4097)  # every candidate is checked at these row counts before it is timed


def tiling(hidden: int, threads: int, floor: int, reread: bool, regime: Regime) -> RowTiling:
    vectors = hidden // VECTOR
    per_block = max(1, 128 // threads) if regime is Regime.PREFILL else 1  # decode: one row per SM
    return RowTiling(hidden, VECTOR, threads, -(-vectors // threads), per_block, floor, reread)


def label(t: RowTiling) -> str:
    return f"T{t.threads_per_row}K{t.vectors_per_thread}m{t.min_blocks_per_sm}{'r' if t.reread else ''}"


def candidates(spec: AddRmsNormSpec, regime: Regime, extra: tuple[tuple[int, int, bool], ...]) -> dict[str, RowTiling]:
    table = rms_norm_tiling(spec, regime, aligned=True, table=gpu_table(current_device().name))
    found = {label(table) + " (table)": table}
    for threads, floor, reread in extra:
        t = tiling(spec.hidden, threads, floor, reread, regime)
        if t != table:
            found.setdefault(label(t), t)
    return found


def check_on_gpu(y: torch.Tensor, h: torch.Tensor, ref: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    """h bit for bit, y within 2e-2 of the largest reference value (the benchmark's check, without the host copy
    that makes it take seconds at these sizes)."""
    ref_y, ref_h = ref
    err = ((y.double() - ref_y.double()).abs().max() / ref_y.double().abs().max()).item()
    if not torch.equal(h, ref_h) or not err <= 2e-2:
        raise AssertionError(f"{what}: h exact {torch.equal(h, ref_h)}, y max rel error {err:.3g}")


def compiled(spec: AddRmsNormSpec, t: RowTiling, cache: KernelCache) -> Any:
    """The candidate's compiled function, checked first against the reference at CHECK_ROWS."""
    function = cache.get(AddRmsNormVariant(spec, t, current_device().arch))
    load_into_context(function, n_args=7)
    dtype, stream = getattr(torch, spec.dtype), torch.cuda.current_stream().cuda_stream
    w = torch.randn(spec.hidden, device="cuda", dtype=getattr(torch, spec.weight_dtype))
    for rows in CHECK_ROWS:
        x, r = (torch.randn(rows, spec.hidden, device="cuda", dtype=dtype) for _ in range(2))
        y, h = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        function(x.data_ptr(), r.data_ptr(), w.data_ptr(), y.data_ptr(), h.data_ptr(), rows, stream)
        check_on_gpu(y, h, add_norm_reference(x, r, w, spec.params), f"{label(t)} {spec} rows={rows}")
    return function


def peer_calls(peers: Any, xs: list, rs: list, w: torch.Tensor) -> dict[str, Any]:
    """QuACK's and Liger's add+RMSNorm (each allocates its outputs per call, as their public functions do) and
    torch.compile's, as calls on input set i returning (y, h)."""
    calls = {name: (lambda i, fn=fn: fn(xs[i], rs[i], w)) for name, fn in peers.add_rms_norm.items()}
    compiled_fn = fresh_compile(llama_add_rms_norm)
    calls["compile"] = lambda i: compiled_fn(xs[i], rs[i], w)
    return calls


def sweep_prefill(
    name: str, spec: AddRmsNormSpec, rows: int, functions: dict[str, Any], reps: int, copy: float, peers: Any
) -> list[dict[str, Any]]:
    hidden = spec.hidden
    nbytes = 4 * rows * hidden * 2 + hidden * 2
    n_sets = input_sets(nbytes)
    dtype = getattr(torch, spec.dtype)
    xs = [torch.randn(rows, hidden, device="cuda", dtype=dtype) for _ in range(n_sets)]
    rs = [torch.randn(rows, hidden, device="cuda", dtype=dtype) for _ in range(n_sets)]
    ys = [torch.full_like(xs[0], float("nan")) for _ in range(n_sets)]
    hs = [torch.full_like(xs[0], float("nan")) for _ in range(n_sets)]
    w = torch.randn(hidden, device="cuda", dtype=getattr(torch, spec.weight_dtype))
    ref = add_norm_reference(xs[0], rs[0], w, spec.params)
    stream = torch.cuda.current_stream().cuda_stream
    calls: dict[str, Any] = {}
    for t_name, f in functions.items():

        def ours(i: int, f: Any = f) -> tuple[torch.Tensor, torch.Tensor]:
            f(xs[i].data_ptr(), rs[i].data_ptr(), w.data_ptr(), ys[i].data_ptr(), hs[i].data_ptr(), rows, stream)
            return ys[i], hs[i]

        calls[t_name] = ours
    if peers is not None and spec.params == LLAMA and spec.weight_dtype == spec.dtype == "bfloat16":
        table_name, table_f = next(iter(functions.items()))

        def allocating(i: int, f: Any = table_f) -> tuple[torch.Tensor, torch.Tensor]:
            # The table's kernel writing outputs allocated in the call, as the peers' functions do.
            y, h = torch.empty_like(xs[i]), torch.empty_like(xs[i])
            f(xs[i].data_ptr(), rs[i].data_ptr(), w.data_ptr(), y.data_ptr(), h.data_ptr(), rows, stream)
            return y, h

        calls[table_name.removesuffix(" (table)") + " (table, outputs per call)"] = allocating
        calls.update(peer_calls(peers, xs, rs, w))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        for t_name, call in calls.items():
            times[t_name].append(median_event_us(call, n_sets))
            if rep == 0:
                check_on_gpu(*call(0), ref, f"{t_name} {rows}x{hidden}")
                ys[0].fill_(float("nan"))
                hs[0].fill_(float("nan"))
            print(f"  {rows}x{hidden} {name} {t_name:<20} {times[t_name][-1]:7.2f} µs", flush=True)
    return [
        {
            "shape": f"{rows}x{hidden}",
            "spec": name,
            "tiling": t_name,
            "us": times[t_name],
            "pct_copy": [100 * nbytes / us / 1e3 / copy for us in times[t_name]],
        }
        for t_name in calls
    ]


DECODE_SPEC = AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA)


def sweep_decode(rows: int, functions: dict[str, Any], reps: int) -> list[dict[str, Any]]:
    hidden = DECODE_SPEC.hidden
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    y, h = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    ref = add_norm_reference(x, r, w, LLAMA)
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(reps):
        for name, f in functions.items():

            def call(f: Any = f) -> None:
                stream = torch.cuda.current_stream().cuda_stream
                f(x.data_ptr(), r.data_ptr(), w.data_ptr(), y.data_ptr(), h.data_ptr(), rows, stream)

            times[name].append(graph_replay_us(call))
            check_on_gpu(y, h, ref, f"{name} decode rows={rows}")
            y.fill_(float("nan"))
            h.fill_(float("nan"))
    return [{"rows": rows, "tiling": name, "us": times[name]} for name in functions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", nargs="*", default=None, help="prefill shapes as ROWSxHIDDEN (no decode rows)")
    parser.add_argument("--specs", nargs="*", default=None, help="the rows' semantics, e.g. llama-bf16 (default: all)")
    parser.add_argument("--peers", action="store_true", help="QuACK, Liger and torch.compile in the same loop")
    args = parser.parse_args()
    cache = KernelCache()
    copy = copy_bandwidth_gbs()
    print(f"D2D copy (read + write): {copy:.0f} GB/s", flush=True)
    cases = [
        case
        for case in PREFILL
        if (args.only is None or f"{case[2]}x{case[1].hidden}" in args.only)
        and (args.specs is None or case[0] in args.specs)
    ]
    # Every candidate compiled before QuACK is imported: importing it patches CuTe's tensor classes process-wide.
    functions = [
        {t_name: compiled(spec, t, cache) for t_name, t in candidates(spec, Regime.PREFILL, extra).items()}
        for _, spec, _, extra in cases
    ]
    decode_functions = (
        {}
        if args.only is not None
        else {
            t_name: compiled(DECODE_SPEC, t, cache)
            for t_name, t in candidates(DECODE_SPEC, Regime.DECODE, DECODE_CANDIDATES).items()
        }
    )
    peers = load_peers() if args.peers else None
    for line in peers.skipped if peers else ():
        print(line, flush=True)
    prefill = [
        r
        for (name, spec, rows, _), found in zip(cases, functions, strict=True)
        for r in sweep_prefill(name, spec, rows, found, args.reps, copy, peers)
    ]
    decode = (
        [] if args.only is not None else [r for n in DECODE_ROWS for r in sweep_decode(n, decode_functions, args.reps)]
    )
    print("\nPrefill add+norm, bf16: µs and % of copy per repetition")
    for r in prefill:
        runs = "  ".join(f"{us:7.2f} ({pct:5.1f}%)" for us, pct in zip(r["us"], r["pct_copy"], strict=True))
        print(f"  {r['shape']:>11} {r['spec']:<16} {r['tiling']:<20} {runs}")
    print("\nDecode add+norm, bf16, H=4096: µs per call in graph replay, per repetition")
    for r in decode:
        runs = "  ".join(f"{us:5.2f}" for us in r["us"])
        print(f"  rows {r['rows']:>3} {r['tiling']:<20} {runs}  median {statistics.median(r['us']):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"copy_gbs": copy, "prefill": prefill, "decode": decode}, indent=1))


if __name__ == "__main__":
    main()
