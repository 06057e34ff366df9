"""The kernel benchmark's `rope` section: the QK-norm + rotary kernel (docs/kernels.md, "QK-norm + rotary
embedding") on Qwen3-8B's heads (32 q heads, 8 kv heads, D 128, bf16, rope theta 1e6), beside our QK-norm alone, our
QK-norm followed by torch.compile's rotation, torch.compile of the whole (Hugging Face's RMSNorm then
apply_rotary_pos_emb, token-major so that no transpose is timed), and a same-size copy. Run by
`python -m trtfuse.bench.kernels --sections rope`.

Decode: B sequences of one token each (cos/sin [B, 1, D] of their own positions), µs per call in CUDA-graph replay
of raw-pointer launches (as a plugin enqueues). Prefill: one sequence of S tokens (cos/sin [1, S, D]),
event-timed medians over input sets that move 3x the L2. Bytes counted: q and k read and written, cos and sin read
once, both weights once. Inputs fresh, our outputs NaN-poisoned, every output checked against the float64
reference (trtfuse.bench.reference.qk_norm_rope_reference) after its timing.
"""

from __future__ import annotations

from typing import Any

import torch

from trtfuse.bench.reference import qk_norm_rope_reference, rotary_tables
from trtfuse.bench.timing import (
    LLAMA,
    QK_HEADS,
    fresh_compile,
    graph_replay_us,
    input_sets,
    llama_rms_norm,
    median_event_us,
    same_size_copy_us,
)
from trtfuse.kernels.api import get_qk_norm, get_qk_norm_rope, shared_cache
from trtfuse.kernels.compiler import QkNormRopeVariant
from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams
from trtfuse.kernels.tiling import with_block_threads
from trtfuse.verify.tolerances import output_error

THETA = 1e6  # Qwen3's rope_theta
DECODE_TOKENS = (1, 8, 32)
PREFILL_TOKENS = (4096, 8192, 16384)
DECODE_TARGET_US = 0.2  # at most this much over our QK-norm alone
PREFILL_TARGET_PCT = 95.0  # of the same-size copy's rate
# Block sizes of the head-row tiling tried beside the rule's (128 threads: 8 heads of 16 lanes).
SWEEP_BLOCK_THREADS = (64, 128, 256, 512)
SWEEP_TOKENS = (1, 32, 16384)


def qwen3_spec() -> QkNormRopeSpec:
    head_dim = QK_HEADS[2]
    rope = RopeParams(head_dim, head_dim, "half", "token_major")
    return QkNormRopeSpec(head_dim, head_dim, "bfloat16", "bfloat16", LLAMA, rope=rope)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rotation(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's apply_rotary_pos_emb on token-major [B, S, H, D] (cos/sin [Bc, S, D], unsqueezed on heads)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def hf_qk_norm_rope(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's attention prologue: the q and k RMSNorms, then the rotation."""
    return hf_rotation(llama_rms_norm(q, wq), llama_rms_norm(k, wk), cos, sin)


class RopeInputs:
    """`sets` fresh input sets of one shape (q, k, cos, sin of real positions) and our poisoned outputs, in the
    layout of `spec` (default `qwen3_spec()`: [B, S, H, D]; a head-major one [B, H, S, D]; outputs [B, H, S, D] where
    it moves heads), on `device`."""

    def __init__(
        self, tokens: int, decode: bool, sets: int, spec: QkNormRopeSpec | None = None, device: str = "cuda"
    ) -> None:
        q_heads, k_heads, head_dim = QK_HEADS
        self.spec = spec or qwen3_spec()
        rope = self.spec.rope
        self.batch, self.seq_len = (tokens, 1) if decode else (1, tokens)
        batch, seq_len = self.batch, self.seq_len
        head_major = [(batch, heads, seq_len, head_dim) for heads in (q_heads, k_heads)]
        token_major = [(batch, seq_len, heads, head_dim) for heads in (q_heads, k_heads)]
        shapes = head_major if rope.layout == "head_major" else token_major
        out_shapes = head_major if rope.moves_heads else shapes
        bf16 = torch.bfloat16
        self.ins = [tuple(torch.randn(shape, device=device, dtype=bf16) for shape in shapes) for _ in range(sets)]
        self.outs = [tuple(torch.full(shape, float("nan"), device=device, dtype=bf16) for shape in out_shapes)]
        self.outs += [tuple(torch.empty_like(out) for out in self.outs[0]) for _ in range(sets - 1)]
        self.weights = tuple(torch.randn(head_dim, device=device, dtype=bf16) for _ in range(2))
        # Decode: each sequence at its own position; prefill: positions 0..S-1 of one sequence.
        positions = torch.randint(0, 32768, (batch, 1), device=device) if decode else None
        if positions is None:
            positions = torch.arange(seq_len, device=device)[None, :]
        self.tables = [rotary_tables(positions, head_dim, THETA, "half", bf16) for _ in range(sets)]
        self.rows = (tokens * q_heads, tokens * k_heads)

    def pointers(self, i: int) -> list[int]:
        (q, k), (wq, wk), (cos, sin), (q_out, k_out) = self.ins[i], self.weights, self.tables[i], self.outs[i]
        return [t.data_ptr() for t in (q, k, wq, wk, cos, sin, q_out, k_out)]

    def extents(self, i: int) -> tuple[int, int, int]:
        return self.batch, self.seq_len, self.tables[i][0].shape[0]


def check_rotated(outs: tuple[torch.Tensor, torch.Tensor], inputs: RopeInputs, i: int, what: str) -> float:
    """Both outputs against the float64 reference: no NaN, max relative error within 2e-2; returns that error."""
    worst = 0.0
    spec = inputs.spec
    cos, sin = inputs.tables[i]
    for part, (x, w, out) in enumerate(zip(inputs.ins[i], inputs.weights, outs, strict=True)):
        reference = qk_norm_rope_reference(x, w, cos, sin, spec, part, inputs.batch, inputs.seq_len)[0]
        if torch.isnan(out).any():
            raise AssertionError(f"{what}: NaN in {'qk'[part]}_out (unwritten poisoned elements?)")
        error = output_error(what, out.double().cpu().numpy(), reference.double().cpu().numpy()).max_rel
        if error > 2e-2:
            raise AssertionError(f"{what}: max rel error {error:.3g} in {'qk'[part]}_out")
        worst = max(worst, error)
    return worst


def bench_shape(tokens: int, decode: bool, compiled: bool) -> dict[str, Any]:
    """One shape: ours (twice, first and last), our QK-norm alone, our QK-norm + torch.compile's rotation,
    torch.compile of the whole, and (prefill) the same-size copy."""
    q_heads, k_heads, head_dim = QK_HEADS
    spec = qwen3_spec()
    kernel, qk = get_qk_norm_rope(spec), get_qk_norm(spec.norm())
    kernel.warm_up(tokens * q_heads)
    qk.warm_up(tokens * q_heads)
    # q and k read and written, both weights, cos and sin (one row per token: B rows in decode, S in prefill).
    nbytes = 2 * 2 * tokens * (q_heads + k_heads) * head_dim + 2 * 2 * head_dim + 2 * 2 * tokens * head_dim
    sets = 1 if decode else input_sets(nbytes)
    inputs = RopeInputs(tokens, decode, sets)
    plain_outs = [tuple(torch.empty_like(x) for x in pair) for pair in inputs.ins]

    def ours(i: int) -> None:
        kernel.launch(*inputs.pointers(i), *inputs.rows, *inputs.extents(i), torch.cuda.current_stream().cuda_stream)

    def qk_alone(i: int) -> None:
        qk(*inputs.ins[i], *inputs.weights, *plain_outs[i])

    rotation = fresh_compile(hf_rotation) if compiled else None

    def qk_then_rotation(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        q_out, k_out = qk(*inputs.ins[i], *inputs.weights, *plain_outs[i])
        return rotation(q_out, k_out, *inputs.tables[i])

    timed = {"ours_us": ours, "qk_us": qk_alone}
    whole = None
    if compiled:
        timed["qk_then_compile_us"] = qk_then_rotation
    row: dict[str, Any] = {"tokens": tokens, "bytes": nbytes, "timing": "graph" if decode else "events"}
    if not decode:
        row["same_size_copy_us"] = same_size_copy_us(nbytes)
    for key, call in timed.items():
        row[key] = graph_replay_us(lambda call=call: call(0)) if decode else median_event_us(call, sets)
    row["ours_error"] = check_rotated(inputs.outs[0], inputs, 0, f"ours tokens={tokens}")
    if compiled:
        row["qk_then_compile_error"] = check_rotated(qk_then_rotation(0), inputs, 0, f"qk+compile tokens={tokens}")
        # After the rotation alone's timing: a fresh dynamo for the whole prologue.
        whole = fresh_compile(hf_qk_norm_rope)

        def compiled_whole(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return whole(*inputs.ins[i], *inputs.weights, *inputs.tables[i])

        row["compile_us"] = (
            graph_replay_us(lambda: compiled_whole(0)) if decode else median_event_us(compiled_whole, sets)
        )
        row["compile_error"] = check_rotated(compiled_whole(0), inputs, 0, f"torch.compile tokens={tokens}")
    for out in inputs.outs[0]:
        out.fill_(float("nan"))
    row["ours_us_again"] = graph_replay_us(lambda: ours(0)) if decode else median_event_us(ours, sets)
    check_rotated(inputs.outs[0], inputs, 0, f"ours again tokens={tokens}")
    if not decode:
        row["ours_pct_same_size_copy"] = 100 * row["same_size_copy_us"] / min(row["ours_us"], row["ours_us_again"])
    return row


def bench_block_sizes() -> list[dict[str, Any]]:
    """The head-row tiling (16 lanes a head, one 16-byte vector each) in blocks of SWEEP_BLOCK_THREADS threads:
    what the rule's 128 stands against, per token count, on this GPU."""
    spec = qwen3_spec()
    kernel = get_qk_norm_rope(spec)
    rule = kernel.variant()
    results = []
    for threads in SWEEP_BLOCK_THREADS:
        variant = QkNormRopeVariant(
            spec, with_block_threads(rule.q_tiling, threads), with_block_threads(rule.k_tiling, threads), rule.arch
        )
        function = shared_cache().get(variant)
        for tokens in SWEEP_TOKENS:
            decode = tokens <= 32
            inputs = RopeInputs(tokens, decode, 1 if decode else input_sets(2 * 2 * tokens * 40 * 128))

            def launch(i: int, function: Any = function, inputs: RopeInputs = inputs) -> None:
                stream = torch.cuda.current_stream().cuda_stream
                function(*inputs.pointers(i), *inputs.rows, *inputs.extents(i), stream)

            us = (
                graph_replay_us(lambda launch=launch: launch(0)) if decode else median_event_us(launch, len(inputs.ins))
            )
            check_rotated(inputs.outs[0], inputs, 0, f"block {threads} tokens={tokens}")
            results.append({"block_threads": threads, "tokens": tokens, "us": us, "rule": threads == 128})
    return results


def run_rope(compiled: bool) -> dict[str, Any]:
    rows = [bench_shape(tokens, True, compiled) for tokens in DECODE_TOKENS]
    rows += [bench_shape(tokens, False, compiled) for tokens in PREFILL_TOKENS]
    return {"rope": rows, "rope_block_sizes": bench_block_sizes()}


def rope_target_checks(report: dict[str, Any]) -> list[tuple[str, bool]]:
    """Issue 29's targets for the rotary kernel, each with whether this run met it."""
    checks = []
    for r in report.get("rope", []):
        ours, tokens = min(r["ours_us"], r["ours_us_again"]), r["tokens"]
        if r["timing"] == "graph":
            goal = DECODE_TARGET_US
            checks.append((f"rope tokens={tokens} within {goal} µs of our QK-norm alone", ours <= r["qk_us"] + goal))
        else:
            goal = PREFILL_TARGET_PCT
            checks.append(
                (f"rope tokens={tokens} >= {goal}% of a same-size copy", r["ours_pct_same_size_copy"] >= goal)
            )
        for key, name in (
            ("qk_then_compile_us", "our QK-norm + torch.compile's rotation"),
            ("compile_us", "torch.compile"),
        ):
            if key in r:
                checks.append((f"rope tokens={tokens} faster than {name}", ours < r[key]))
    return checks


def print_rope_report(report: dict[str, Any]) -> None:
    q_heads, k_heads, head_dim = QK_HEADS
    print(f"\nQK-norm + rotary, Qwen3-8B heads ({q_heads} q / {k_heads} k of {head_dim}, bf16, theta {THETA:g}), µs")
    print("('ours' twice: first and last timing; 'qk' = our QK-norm alone; 'qk+rot' = our QK-norm, then")
    print(" torch.compile's rotation; 'compile' = torch.compile of the norms and the rotation; decode in graph replay)")
    for r in report["rope"]:
        line = f"  tokens {r['tokens']:>5} ({r['timing']:>6}): ours {r['ours_us']:7.2f} {r['ours_us_again']:7.2f}"
        line += f" | qk {r['qk_us']:7.2f}"
        for key, label in (("qk_then_compile_us", "qk+rot"), ("compile_us", "compile")):
            if key in r:
                line += f" | {label} {r[key]:7.2f}"
        if "same_size_copy_us" in r:
            line += f" | copy {r['same_size_copy_us']:7.2f} ({r['ours_pct_same_size_copy']:5.1f}% of copy)"
        print(line)
    print("\nHead-row blocks of the rotary kernel (threads per block; '*' = the rule), µs")
    for r in report.get("rope_block_sizes", []):
        mark = "*" if r["rule"] else " "
        print(f"  {r['block_threads']:>4} threads, tokens {r['tokens']:>5}: {r['us']:8.2f}{mark}")
