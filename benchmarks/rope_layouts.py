"""The QK-norm + rotary kernel in each head layout it runs in, beside our QK-norm alone on the same rows.

    PYTHONPATH=. python3 benchmarks/rope_layouts.py [--reps N] [--json PATH]

The benchmark's rope section (bench/rope.py) times the token-major node, [B, S, H, D] in and out (optimum's and
TorchScript's Qwen3). The other two forms the matcher writes run other code: a head-major node, [B, H, S, D] in and
out (Gemma3: its row's token is found with one more division, `row mod S`), and a token-major node that writes the
attention's [B, H, S, D] itself (ModelOpt's FP8 Qwen3 and OLMo2: each row's output starts at ((b·H + h)·S + s)·D).
Each is timed here on Qwen3-8B's heads (bf16, theta 1e6) as the benchmark times the token-major one: decode (1, 8, 32
sequences of one token) per call in CUDA-graph replay of raw-pointer launches, prefill (4096 and 16384 tokens of one
sequence) event-timed medians over input sets that move 3x the L2, beside a same-size copy; each layout `--reps`
times, interleaved with the others and with our QK-norm alone, every output checked against the float64 reference.
Issue 29's targets are the token-major node's (decode within 0.2 µs of our QK-norm, prefill at least 95 % of the
copy); this prints how far the other two are from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.rope import DECODE_TARGET_US, RopeInputs, check_rotated, qwen3_spec
from trtfuse.bench.timing import QK_HEADS, graph_replay_us, input_sets, median_event_us, same_size_copy_us
from trtfuse.kernels.api import get_qk_norm, get_qk_norm_rope
from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams

DECODE_TOKENS = (1, 8, 32)
PREFILL_TOKENS = (4096, 16384)


def layout_specs() -> dict[str, QkNormRopeSpec]:
    """The three forms, on Qwen3-8B's heads: the benchmark's token-major node, a head-major one, and a token-major
    one writing [B, H, S, D]."""
    token_major = qwen3_spec()
    head_dim = token_major.rope.head_dim

    def with_rope(*layouts: str) -> QkNormRopeSpec:
        return dataclasses.replace(token_major, rope=RopeParams(head_dim, head_dim, "half", *layouts))

    return {
        "token-major": token_major,
        "head-major": with_rope("head_major"),
        "writes head-major": with_rope("token_major", "head_major"),
    }


def rope_bytes(tokens: int) -> int:
    """q and k read and written, both weights, cos and sin (one row per token): bench/rope.py's count."""
    q_heads, k_heads, head_dim = QK_HEADS
    return 2 * 2 * tokens * (q_heads + k_heads) * head_dim + 2 * 2 * head_dim + 2 * 2 * tokens * head_dim


def shape_calls(tokens: int, decode: bool, sets: int, specs: dict[str, QkNormRopeSpec]) -> dict[str, Any]:
    """Each layout's launch on its own inputs (and our QK-norm alone on the token-major ones), as calls on input
    set i, with the inputs to check the outputs against."""
    calls: dict[str, Any] = {}
    inputs: dict[str, RopeInputs] = {}
    for name, spec in specs.items():
        kernel = get_qk_norm_rope(spec)
        kernel.warm_up(tokens * QK_HEADS[0])
        data = inputs[name] = RopeInputs(tokens, decode, sets, spec)

        def launch(i: int, kernel: Any = kernel, data: RopeInputs = data) -> None:
            stream = torch.cuda.current_stream().cuda_stream
            kernel.launch(*data.pointers(i), *data.rows, *data.extents(i), stream)

        calls[name] = launch
    qk = get_qk_norm(qwen3_spec().norm())
    qk.warm_up(tokens * QK_HEADS[0])
    plain = inputs["token-major"]
    plain_outs = [tuple(torch.empty_like(x) for x in pair) for pair in plain.ins]
    calls["qk-norm alone"] = lambda i: qk(*plain.ins[i], *plain.weights, *plain_outs[i])
    return {"calls": calls, "inputs": inputs}


def bench_layouts(reps: int) -> list[dict[str, Any]]:
    specs = layout_specs()
    rows = []
    for tokens, decode in [(t, True) for t in DECODE_TOKENS] + [(t, False) for t in PREFILL_TOKENS]:
        nbytes = rope_bytes(tokens)
        sets = 1 if decode else input_sets(nbytes)
        built = shape_calls(tokens, decode, sets, specs)
        times: dict[str, list[float]] = {name: [] for name in built["calls"]}
        for _ in range(reps):
            for name, call in built["calls"].items():
                us = graph_replay_us(lambda call=call: call(0)) if decode else median_event_us(call, sets)
                times[name].append(us)
        for name, data in built["inputs"].items():
            check_rotated(data.outs[0], data, 0, f"{name} tokens={tokens}")
        row: dict[str, Any] = {"tokens": tokens, "timing": "graph" if decode else "events", "us": times}
        if not decode:
            row["same_size_copy_us"] = same_size_copy_us(nbytes)
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    best = {name: min(values) for name, values in row["us"].items()}
    cells = [f"tokens {row['tokens']:>5} ({row['timing']:>6})"]
    for name, us in best.items():
        if name == "qk-norm alone":
            cells.append(f"{name} {us:7.2f}")
        elif row["timing"] == "graph":
            cells.append(f"{name} {us:7.2f} (+{us - best['qk-norm alone']:.2f})")
        else:
            cells.append(f"{name} {us:7.2f} ({100 * row['same_size_copy_us'] / us:5.1f}% of copy)")
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"QK-norm + rotary by head layout, Qwen3-8B heads, bf16: best of {args.reps} repeats, µs", flush=True)
    print(f"(decode: + µs over our QK-norm alone, target +{DECODE_TARGET_US}; prefill: % of a same-size copy)")
    rows = bench_layouts(args.reps)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rope_layouts": rows}, indent=1))


if __name__ == "__main__":
    main()
