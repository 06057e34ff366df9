"""Where the QK-norm + rotary kernel's decode time goes: the kernel with one part of the rotation taken out at a time.

    PYTHONPATH=. python3 benchmarks/rope_decode_probe.py [--reps N] [--json PATH]

Issue 29 holds the rotary kernel's decode (1-32 tokens, Qwen3-8B heads) to 0.2 µs over our QK-norm alone; the first
H100 run measured 0.32-0.34 µs. Each probe is the same kernel compiled with one piece replaced while tracing, into a
cache of its own, and timed as the benchmark times decode (CUDA-graph replay of raw-pointer launches, bench/rope.py):

- `rotary`: the kernel as it is; `qk`: our QK-norm alone (the target's baseline);
- `row 0`: every row reads cos/sin row 0 (the integer divisions that find a row's table row are gone);
- `no tables`: cos and sin are never loaded (the rotation multiplies by whatever the registers hold);
- `no rotation`: y is stored as the QK-norm stores it (cos/sin still loaded, no shuffles, no products).

The probes' outputs are wrong by construction and not checked; `rotary` is checked against the float64 reference.
Each probe is timed `--reps` times, interleaved with the others, so drift shows as spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.rope import RopeInputs, check_rotated, qwen3_spec
from trtfuse.bench.timing import QK_HEADS, graph_replay_us
from trtfuse.kernels import norm_kernel
from trtfuse.kernels.api import get_qk_norm, get_qk_norm_rope
from trtfuse.kernels.cache import KernelCache

TOKENS = (1, 8, 32)


@contextmanager
def replaced(owner: object, name: str, value: object) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _row_zero(rotation: Any, row: Any) -> Any:
    return norm_kernel.Int32(0)


def _no_tables(*args: Any) -> None:
    return None


def _plain_store(r_y: Any, y: Any, r_cos: Any, r_sin: Any, lane: Any, plan: Any, rotation: Any, tiling: Any, math: Any):
    norm_kernel._store_float(r_y, y, math)


PROBES: dict[str, tuple[object, str, object] | None] = {
    "rotary": None,
    "row 0": (norm_kernel, "_cos_row", norm_kernel.cute.jit(_row_zero)),
    "no tables": (norm_kernel, "_load_rotation", _no_tables),
    "no rotation": (norm_kernel, "_store_rotated", norm_kernel.cute.jit(_plain_store)),
}


def compiled_probes() -> dict[str, Callable[..., None]]:
    variant = get_qk_norm_rope(qwen3_spec()).variant()
    functions = {}
    for name, patch in PROBES.items():
        cache = KernelCache(Path(tempfile.mkdtemp(prefix="rope-probe-")))
        if patch is None:
            functions[name] = cache.get(variant)
        else:
            with replaced(*patch):
                functions[name] = cache.get(variant)
    return functions


def time_probes(tokens: int, functions: dict[str, Callable[..., None]], qk: Any, reps: int) -> dict[str, Any]:
    inputs = RopeInputs(tokens, True, 1)

    def stream() -> int:
        return torch.cuda.current_stream().cuda_stream

    def probe(function: Callable[..., None]) -> Callable[[], None]:
        return lambda: function(*inputs.pointers(0), *inputs.rows, *inputs.extents(0), stream())

    (q, k), (wq, wk), (q_out, k_out) = inputs.ins[0], inputs.weights, inputs.outs[0]
    pointers = [t.data_ptr() for t in (q, k, wq, wk, q_out, k_out)]
    calls = {name: probe(function) for name, function in functions.items()}
    calls["qk"] = lambda: qk.launch(*pointers, *inputs.rows, stream())
    calls["rotary"]()
    torch.cuda.synchronize()
    check_rotated(inputs.outs[0], inputs, 0, f"rotary tokens={tokens}")
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(graph_replay_us(call))
    line = "  ".join(f"{name} {statistics.median(v):.3f}" for name, v in times.items())
    print(f"tokens {tokens:>3}: {line}", flush=True)
    return {"tokens": tokens, "us": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    functions = compiled_probes()
    qk = get_qk_norm(qwen3_spec().norm())
    qk.warm_up(max(TOKENS) * QK_HEADS[0])
    results = [time_probes(tokens, functions, qk, args.reps) for tokens in TOKENS]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
