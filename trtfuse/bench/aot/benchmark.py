"""Today's kernels and their AOT artifacts side by side on a GPU: `python -m trtfuse.bench.aot.benchmark [--json PATH]`.

A kernel TensorRT launches from its embedded PTX should take the device time today's kernel takes. In one run, with
trtfuse/bench/kernels.py's method and helpers (copy-bandwidth ceiling, fresh random inputs rotated past the L2, NaN-
poisoned outputs checked against the float64 reference afterwards, medians of event-timed calls, CUDA-graph replays for
decode-sized calls), this times on the benchmark shapes (bf16, Llama's AFTER_CAST):
- today's kernel (RmsNormKernel/QkNormKernel.launch, which picks its tiling and vector width per call), twice, so
  the spread of one version's two timings shows what counts as noise;
- the AOT artifact of every tactic, loaded from its PTX (what TensorRT embeds) with cuModuleLoadData and launched with
  cuLaunchKernel (trtfuse/bench/aot/driver.py), aligned pointers.
Each row names the tactic `regime_for` would pick for its row count and the one that measured faster (TensorRT times
the tactics and keeps the faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.aot.driver import DriverKernel, bind_torch_context
from trtfuse.bench.aot.matrix import Spec, kind_of
from trtfuse.bench.kernels import (
    DECODE_HIDDEN,
    DECODE_ROWS,
    LLAMA,
    PREFILL_SHAPES,
    QK_HEADS,
    QK_TOKENS,
    check_close,
    copy_bandwidth_gbs,
    graph_replay_us,
    input_sets,
    median_event_us,
    same_size_copy_us,
)
from trtfuse.bench.reference import norm_reference
from trtfuse.kernels import artifacts
from trtfuse.kernels.api import get_qk_norm, get_rms_norm
from trtfuse.kernels.declaration import Tactic
from trtfuse.kernels.device import current_device, driver_version, ptx_driver_problem
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import Regime, regime_for

DTYPE = torch.bfloat16
DTYPE_NAME = "bfloat16"
SMALL_QK_TOKENS = 32  # up to here QK-norm is decode-sized: graph replays, one input set
Call = Callable[[int], None]  # call(i) runs on input set i


def expected_tactic(rows: int, sm_count: int, offered: tuple[Tactic, ...]) -> Tactic:
    """Today's per-call choice (`regime_for`) as a tactic, where the artifact offers it."""
    tactic = Tactic.DECODE if regime_for(rows, sm_count) is Regime.DECODE else Tactic.PREFILL
    return tactic if tactic in offered else Tactic.PREFILL


def loadable_image(ptx: str) -> str:
    """ "ptx" where this machine's driver can JIT the artifacts' PTX, else "cubin" (the same kernel, compiled ahead),
    saying so once: a driver older than the PTX ISA would refuse every load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)."""
    problem = ptx_driver_problem(ptx, driver_version())
    if problem is None:
        return "ptx"
    if not _NOTED:
        _NOTED.append(problem)
        print(f"note: {problem}: timing the artifacts' cubins instead of their PTX", flush=True)
    return "cubin"


_NOTED: list[str] = []


def aot_kernels(spec: Spec) -> dict[Tactic, DriverKernel]:
    """Every tactic's artifact for this GPU, loaded from its PTX (or its cubin, `loadable_image`)."""
    arch = current_device().arch
    kind = kind_of(spec)
    build, tactics = getattr(artifacts, kind.build), getattr(artifacts, kind.tactics)
    built = {t: build(spec, t, arch) for t in tactics(spec)}
    image = loadable_image(next(iter(built.values())).ptx)
    return {t: DriverKernel(artifact, image) for t, artifact in built.items()}


def timed_side_by_side(
    today: Call,
    aot_calls: Mapping[Tactic, Call],
    time_one: Callable[[Call], float],
    poison: Callable[[], None],
    verify: Callable[[str], None],
) -> dict[str, Any]:
    """Today's call, every tactic's, then today's again; outputs poisoned before and checked after each."""
    row: dict[str, Any] = {}
    order = [("today_us", today), *((f"aot_{t.name.lower()}_us", call) for t, call in aot_calls.items())]
    for key, call in [*order, ("today_again_us", today)]:
        poison()
        row[key] = time_one(call)
        verify(key)
    fastest = min(aot_calls, key=lambda t: row[f"aot_{t.name.lower()}_us"])
    row["faster_tactic"] = fastest.name.lower()
    row["today_spread_pct"] = 100 * abs(row["today_again_us"] - row["today_us"]) / row["today_us"]
    return row


def add_pct_copy(row: dict[str, Any], nbytes: int, copy_gbs: float) -> None:
    """Each event-timed call's bandwidth as a % of the copy ceiling (graph replays of small calls have none)."""
    for key in [k for k in row if k.endswith("_us") and k != "same_size_copy_us"]:
        row[key.removesuffix("_us") + "_pct_copy"] = 100 * nbytes / row[key] / 1e3 / copy_gbs


def finish(row: dict[str, Any], picked: Tactic) -> dict[str, Any]:
    """The time of the tactic TensorRT would keep (the faster) over the mean of today's two timings."""
    today = statistics.mean((row["today_us"], row["today_again_us"]))
    row["expected_tactic"] = picked.name.lower()
    row["aot_over_today"] = row[f"aot_{row['faster_tactic']}_us"] / today
    return row


def measure(
    row: dict[str, Any],
    today: Call,
    aot_calls: Mapping[Tactic, Call],
    poison: Callable[[], None],
    verify: Callable[[str], None],
    n_sets: int,
    copy_gbs: float,
) -> None:
    """Time today's call and every tactic's into `row` (its "timing" says how: CUDA-graph replays of input set 0,
    or events over the `n_sets` rotating sets, then also against a same-size copy and the run's copy bandwidth)."""
    graph = row["timing"] == "graph"

    def time_one(call: Call) -> float:
        return graph_replay_us(lambda: call(0)) if graph else median_event_us(call, n_sets)

    if not graph:
        row["same_size_copy_us"] = same_size_copy_us(row["bytes"])
    row |= timed_side_by_side(today, aot_calls, time_one, poison, verify)
    if not graph:
        add_pct_copy(row, row["bytes"], copy_gbs)


def bench_rms(rows: int, hidden: int, graph: bool, copy_gbs: float, sm_count: int) -> dict[str, Any]:
    """RMSNorm of rows x hidden bf16: event-timed over rotating input sets, or graph replays for decode rows."""
    spec = RmsNormSpec(hidden, DTYPE_NAME, DTYPE_NAME, LLAMA)
    kernel = get_rms_norm(spec)
    kernel.warm_up(rows)
    loaded = aot_kernels(spec)
    nbytes = 2 * rows * hidden * DTYPE.itemsize + hidden * DTYPE.itemsize
    n_sets = 1 if graph else input_sets(nbytes)
    xs = [torch.randn(rows, hidden, device="cuda", dtype=DTYPE) for _ in range(n_sets)]
    ys = [torch.empty_like(xs[0]) for _ in range(n_sets)]
    w = torch.randn(hidden, device="cuda", dtype=DTYPE)

    def today(i: int) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        kernel.launch(xs[i].data_ptr(), w.data_ptr(), ys[i].data_ptr(), rows, stream)

    def driver_call(loaded_kernel: DriverKernel) -> Call:
        def call(i: int) -> None:
            pointers = {"x": xs[i].data_ptr(), "weight": w.data_ptr(), "y": ys[i].data_ptr()}
            loaded_kernel.launch(pointers, (rows,), torch.cuda.current_stream().cuda_stream)

        return call

    def poison() -> None:
        for y in ys:
            y.fill_(float("nan"))

    def verify(what: str) -> None:
        torch.cuda.synchronize()
        for i in sorted({0, n_sets - 1}):
            check_close(ys[i], norm_reference(xs[i], w, LLAMA), f"{what} {rows}x{hidden} set {i}")

    row = {"shape": f"{rows}x{hidden}", "bytes": nbytes, "timing": "graph" if graph else "events"}
    measure(row, today, {t: driver_call(k) for t, k in loaded.items()}, poison, verify, n_sets, copy_gbs)
    for loaded_kernel in loaded.values():
        loaded_kernel.unload()
    return finish(row, expected_tactic(rows, sm_count, tuple(loaded)))


def bench_qk(tokens: int, copy_gbs: float) -> dict[str, Any]:
    """QK-norm of Qwen3-8B-like heads (bf16): graph replays up to SMALL_QK_TOKENS tokens, else events."""
    q_heads, k_heads, head_dim = QK_HEADS
    spec = QkNormSpec(head_dim, head_dim, DTYPE_NAME, DTYPE_NAME, LLAMA)
    kernel = get_qk_norm(spec)
    kernel.warm_up(tokens * q_heads)
    loaded = aot_kernels(spec)
    q_rows, k_rows = tokens * q_heads, tokens * k_heads
    nbytes = 2 * DTYPE.itemsize * (q_rows + k_rows) * head_dim + 2 * DTYPE.itemsize * head_dim
    graph = tokens <= SMALL_QK_TOKENS
    n_sets = 1 if graph else input_sets(nbytes)
    qs = [torch.randn(q_rows, head_dim, device="cuda", dtype=DTYPE) for _ in range(n_sets)]
    ks = [torch.randn(k_rows, head_dim, device="cuda", dtype=DTYPE) for _ in range(n_sets)]
    q_outs = [torch.empty_like(qs[0]) for _ in range(n_sets)]
    k_outs = [torch.empty_like(ks[0]) for _ in range(n_sets)]
    wq = torch.randn(head_dim, device="cuda", dtype=DTYPE)
    wk = torch.randn(head_dim, device="cuda", dtype=DTYPE)

    def pointers(i: int) -> dict[str, int]:
        tensors = {"q": qs[i], "k": ks[i], "q_weight": wq, "k_weight": wk, "q_out": q_outs[i], "k_out": k_outs[i]}
        return {name: t.data_ptr() for name, t in tensors.items()}

    def today(i: int) -> None:
        p = pointers(i)
        stream = torch.cuda.current_stream().cuda_stream
        kernel.launch(p["q"], p["k"], p["q_weight"], p["k_weight"], p["q_out"], p["k_out"], q_rows, k_rows, stream)

    def driver_call(loaded_kernel: DriverKernel) -> Call:
        def call(i: int) -> None:
            loaded_kernel.launch(pointers(i), (q_rows, k_rows), torch.cuda.current_stream().cuda_stream)

        return call

    def poison() -> None:
        for out in (*q_outs, *k_outs):
            out.fill_(float("nan"))

    def verify(what: str) -> None:
        torch.cuda.synchronize()
        for i in sorted({0, n_sets - 1}):
            check_close(q_outs[i], norm_reference(qs[i], wq, LLAMA), f"{what} qk q tokens={tokens} set {i}")
            check_close(k_outs[i], norm_reference(ks[i], wk, LLAMA), f"{what} qk k tokens={tokens} set {i}")

    row = {"tokens": tokens, "bytes": nbytes, "timing": "graph" if graph else "events"}
    measure(row, today, {t: driver_call(k) for t, k in loaded.items()}, poison, verify, n_sets, copy_gbs)
    for loaded_kernel in loaded.values():
        loaded_kernel.unload()
    return finish(row, Tactic.PREFILL)


def run() -> dict[str, Any]:
    start = time.perf_counter()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sm_count = props.multi_processor_count
    report: dict[str, Any] = {"gpu": props.name, "sms": sm_count, "torch": torch.__version__}
    bind_torch_context()
    copy_gbs = copy_bandwidth_gbs()
    report["copy_gbs"] = copy_gbs
    print(f"{props.name}, {sm_count} SMs; D2D copy (read + write): {copy_gbs:.0f} GB/s", flush=True)
    report["prefill"] = [bench_rms(rows, hidden, False, copy_gbs, sm_count) for rows, hidden in PREFILL_SHAPES]
    report["decode"] = [bench_rms(rows, DECODE_HIDDEN, True, copy_gbs, sm_count) for rows in DECODE_ROWS]
    report["qk_norm"] = [bench_qk(tokens, copy_gbs) for tokens in QK_TOKENS]
    report["image"] = "cubin" if _NOTED else "ptx"
    report["wall_s"] = time.perf_counter() - start
    return report


def _line(label: str, row: Mapping[str, Any]) -> str:
    tactics = [key for key in row if key.startswith("aot_") and key.endswith("_us")]
    line = f"{label:>18} {row['timing']:>6} | today {row['today_us']:8.2f} {row['today_again_us']:8.2f}"
    line += f" ({row['today_spread_pct']:4.1f}%)"
    for key in tactics:
        name = key.removeprefix("aot_").removesuffix("_us")
        mark = "*" if name == row["faster_tactic"] else " "
        line += f" | aot {name} {row[key]:8.2f}{mark}"
    line += f" | expected {row['expected_tactic']:>7} | faster/today {row['aot_over_today']:.3f}"
    if "today_pct_copy" in row:
        faster = row[f"aot_{row['faster_tactic']}_pct_copy"]
        line += f" | %copy today {row['today_pct_copy']:5.1f} aot {faster:5.1f}"
    if "same_size_copy_us" in row:
        line += f" | same-size copy {row['same_size_copy_us']:.2f}"
    return line


def print_report(report: Mapping[str, Any]) -> None:
    image = {"ptx": "PTX", "cubin": "cubin"}[report.get("image", "ptx")]
    print(f"\nAOT artifacts ({image}, bare driver) vs today's kernels, bf16 AFTER_CAST, µs per call; {report['gpu']}")
    print("today: timed first and last (spread in %); '*': the faster tactic, which TensorRT's timing would keep;")
    print("'expected': the tactic today's per-call rule (rows <= SMs: decode) names; faster/today: * over today's mean")
    for row in report["prefill"]:
        print(_line(f"rms {row['shape']}", row))
    for row in report["decode"]:
        print(_line(f"rms {row['shape']}", row))
    for row in report["qk_norm"]:
        print(_line(f"qk tokens {row['tokens']}", row))
    print(f"\naot benchmark wall time {report['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the full results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the AOT benchmark needs a CUDA GPU")
    report = run()
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
