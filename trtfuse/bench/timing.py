"""What every kernel benchmark times with: the shapes and semantics of its rows, torch's and torch.compile's baseline
norm, CUDA-event and CUDA-graph timing, input sets that defeat the L2 cache, and the same run's copy bandwidth (the
ceiling every row is judged against). bench/kernels.py and bench/quant.py both time with these."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.api import get_rms_norm
from trtfuse.kernels.specs import RmsNormSpec
from trtfuse.verify.tolerances import output_error

EPS = 1e-6
LLAMA = NormParams(EPS, 0.0, WeightMode.AFTER_CAST)  # the semantics every benchmark row runs
PREFILL_SHAPES = ((16384, 4096), (8192, 8192), (16384, 2048), (4096, 4096))
DECODE_ROWS = (1, 8, 32)
# Mixed precision, (x, y) dtypes, the weight in y's dtype: an optimum fp16/bf16 export's norm on an fp32 residual
# stream (fp32 in, 16-bit out), and opset-23 RMSNormalization with a 16-bit X and fp32 scale and Y (the reverse).
MIXED_PAIRS = (("float32", "bfloat16"), ("float32", "float16"), ("bfloat16", "float32"))
MIXED_PREFILL_SHAPES = ((16384, 4096), (8192, 8192))
DECODE_HIDDEN = 4096
QK_TOKENS = (1, 8, 32, 1024, 4096, 16384)
QK_HEADS = (32, 8, 128)  # Qwen3-8B: 32 q heads, 8 kv heads, head dim 128
# The fused residual add+RMSNorm (bf16, Llama's semantics) and the GEMM + add + norm layer tail.
ADD_PREFILL_SHAPES = ((16384, 4096), (8192, 8192), (4096, 4096))
ADD_DECODE_ROWS = (1, 32, 128)
TAIL_TOKENS = (1, 8, 128, 4096)
TAIL_HIDDEN = 4096
GRAPH_CALLS = 50  # calls captured per graph: replay time / 50 is the per-call cost without host launch gaps
TIMED_CALLS = 60
HOST_RUN_AHEAD_CYCLES = 100_000_000  # ~50 ms at H200 clocks: longer than the host needs to queue TIMED_CALLS calls


def llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Hugging Face Llama's RMSNorm forward (weight after the cast back): what torch.compile gets to fuse."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def llama_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Hugging Face decoder layer's `hidden_states = residual + hidden_states` then its RMSNorm: (y, h)."""
    h = x + residual
    return llama_rms_norm(h, w), h


def mixed_rms_norm(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, eps: float = EPS) -> torch.Tensor:
    """The contract's AFTER_CAST with x and y of different dtypes, written as a model would (fp32 math): what
    torch.compile gets to fuse for the mixed pairs (the norm of an optimum fp16 export on an fp32 residual stream)."""
    rounding = x.dtype if x.dtype != torch.float32 else out_dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.to(rounding).float() * w.float()).to(out_dtype)


def fresh_compile(function: Callable[..., torch.Tensor] = llama_rms_norm) -> Callable[..., torch.Tensor]:
    """torch.compile of an RMSNorm for one static shape, with dynamo's caches reset so that earlier shapes
    and dtypes never push it past its recompile limit (where it silently falls back to eager)."""
    torch._dynamo.reset()
    return torch.compile(function, dynamic=False)


def median_event_us(call: Callable[[int], None], n_sets: int, iters: int = TIMED_CALLS) -> float:
    """Median of per-call event timings; call(i) uses input set i % n_sets, so repeated calls miss the L2."""
    for i in range(3):
        call(i % n_sets)
    torch.cuda.synchronize()
    # Hold the GPU busy while the host queues every timed call: events then time the GPU, not the Python launch path.
    torch.cuda._sleep(HOST_RUN_AHEAD_CYCLES)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call(i % n_sets)
        ends[i].record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def graph_replay_us(call: Callable[[], None], replays: int = 20) -> float:
    """Per-call time of GRAPH_CALLS captured calls, median over replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(GRAPH_CALLS):
            call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / GRAPH_CALLS)
    return statistics.median(times)


def input_sets(set_bytes: int) -> int:
    """Enough rotating input sets that one pass over them is at least 3x the L2."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(2, math.ceil(3 * l2 / set_bytes))


def copy_bandwidth_gbs() -> float:
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = median_event_us(lambda _: dst.copy_(src), 1, iters=20)
    return 2 * n / us / 1e3


def launch_floor_us() -> float:
    """Event-timed no-op launch of our kernel (0 rows: one block that returns at once): the fixed cost every
    event-timed call carries, whatever its size. A pass of B bytes then takes at least B / copy rate + this floor."""
    kernel = get_rms_norm(RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA))
    kernel.warm_up(4096)
    stream = torch.cuda.current_stream().cuda_stream
    return median_event_us(lambda _: kernel.launch(0, 0, 0, 0, stream), 1)


def attainable_pct(nbytes: int, copy_gbs: float, floor_us: float) -> float:
    """The highest % of the copy rate an event-timed pass over `nbytes` can show, given the launch floor."""
    ideal_us = nbytes / copy_gbs / 1e3
    return 100 * ideal_us / (ideal_us + floor_us)


def same_size_copy_us(nbytes: int) -> float:
    """A D2D copy moving the same bytes (half read, half written): the floor for a pass of this size, ramp included."""
    n = nbytes // 2
    n_sets = input_sets(nbytes)
    srcs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(n_sets)]
    dsts = [torch.empty_like(srcs[0]) for _ in range(n_sets)]
    return median_event_us(lambda i: dsts[i].copy_(srcs[i]), n_sets)


def check_close(y: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """A benchmarked output against the reference: no NaN left, relative error within 2e-2."""
    if torch.isnan(y).any():
        raise AssertionError(f"{what}: NaN in output (unwritten poisoned elements?)")
    err = output_error(what, y.double().cpu().numpy(), ref.double().cpu().numpy()).max_rel
    if err > 2e-2:
        raise AssertionError(f"{what}: max rel error {err:.3g} against torch")


def check_add_norm(y: torch.Tensor, h: torch.Tensor, ref: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    """y within check_close's 2e-2, h exactly D(x + residual) (peers may compute y from the unrounded sum)."""
    check_close(y, ref[0], f"{what} y")
    if not torch.equal(h, ref[1]):
        raise AssertionError(f"{what}: h differs from D(x + residual)")
