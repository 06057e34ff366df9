"""The kernel benchmark's `quant` section: the norm kernels with their quantizer stages (docs/kernels.md,
"Quantizer stages") side by side with torch.compile's fused norm + quantize, in the same process as the copy that
sets the ceiling (docs/performance.md, "Quantized norms"). Run by `python -m trtfuse.bench.kernels --sections quant`.

Bytes counted: x read (and the add+norm's residual), y written at 1 byte per element (and h), the weight once.
torch.compile gets the formula as a model writes it (Hugging Face's RMSNorm, then QuantizeLinear's arithmetic:
divide by the scale, clamp or round and clamp, cast), which Inductor fuses into one kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trtfuse.bench.aot.compare import quantization_step
from trtfuse.bench.reference import QUANT_TORCH_DTYPES, add_norm_reference, norm_reference
from trtfuse.bench.timing import (
    DECODE_HIDDEN,
    LLAMA,
    PREFILL_SHAPES,
    QK_HEADS,
    fresh_compile,
    graph_replay_us,
    input_sets,
    llama_rms_norm,
    median_event_us,
    same_size_copy_us,
)
from trtfuse.contract import Quantizer, QuantParams
from trtfuse.kernels.api import (
    RmsNormKernel,
    get_add_rms_norm,
    get_qk_norm,
    get_rms_norm,
    rms_norm_tiling,
    shared_cache,
)
from trtfuse.kernels.compiler import AddRmsNormVariant, RmsNormVariant
from trtfuse.kernels.specs import AddRmsNormSpec, QkNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import PREFILL_BLOCK_THREADS, Regime, RowTiling

# Per-tensor scales as ModelOpt calibrates them (amax / 448, amax / 127), float32 values, neither a power of two.
OUTPUTS = {
    "fp8": Quantizer("float8_e4m3fn", float(np.float32(4.5 / 448))),
    "int8": Quantizer("int8", float(np.float32(4.5 / 127))),
}
# ModelOpt FP8's pair on the residual sum, dequantized back to bf16.
SUM_FAKE_QUANT = Quantizer("float8_e4m3fn", float(np.float32(12.0 / 448)), True, "bfloat16")
ADD_SHAPES = ((16384, 4096), (8192, 8192), (4096, 4096))
DECODE_ROWS = (1, 32, 128)
# The targets (docs/performance.md): prefill 16384x4096 µs and % of the same-run copy, decode µs per rows.
NORM_TARGET_US = 52.0
NORM_TARGET_PCT = 95.0
ADD_TARGET_US = 118.0
DECODE_TARGET_US = {1: 1.7, 32: 1.8, 128: 2.1}
TARGET_SHAPE = "16384x4096"
# A quantized QK-norm as Gemma3's INT8 exports have it: q_out and k_out each with its own scale.
QK_QUANT = QuantParams(
    q_output=Quantizer("int8", float(np.float32(5.0 / 127))), k_output=Quantizer("int8", float(np.float32(6.0 / 127)))
)
QK_QUANT_TOKENS = (1, 32, 4096)


def torch_quantize(y: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """QuantizeLinear's arithmetic in torch: y / s in float32, then E4M3FN's saturating cast or INT8's round and
    clamp."""
    q = y.float() / quantizer.scale
    if quantizer.dtype == "int8":
        return q.round().clamp(-128, 127).to(torch.int8)
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def norm_quant(x: torch.Tensor, w: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """A Llama RMSNorm read by a QuantizeLinear: what torch.compile fuses into one kernel."""
    return torch_quantize(llama_rms_norm(x, w), quantizer)


def add_norm_quant(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, quantizer: Quantizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOpt FP8's layer: h = x + residual, the norm reads DQ(Q(h)), its output is quantized; (y, h)."""
    h = x + residual
    v = (torch_quantize(h, SUM_FAKE_QUANT).float() * SUM_FAKE_QUANT.scale).to(h.dtype)
    return torch_quantize(llama_rms_norm(v, w), quantizer), h


def norm_spec(hidden: int, quantizer: Quantizer) -> RmsNormSpec:
    return RmsNormSpec(hidden, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(output=quantizer))


def add_norm_spec(hidden: int, quantizer: Quantizer) -> AddRmsNormSpec:
    quant = QuantParams(input=SUM_FAKE_QUANT, output=quantizer)
    return AddRmsNormSpec(hidden, "bfloat16", "bfloat16", LLAMA, quant=quant)


def quantized_agreement(out: torch.Tensor, reference: torch.Tensor, quantizer: Quantizer) -> dict[str, Any]:
    """How `out`'s codes agree with the reference's, dequantized: elements equal, one quantization step off, and
    beyond a step and 2e-2 (with the worst such element), and NaN on one side only."""
    ours = out.double() * quantizer.scale
    ref = reference.double() * quantizer.scale
    nan_one_side = int((ours.isnan() != ref.isnan()).sum())
    ours, ref = ours.nan_to_num(), ref.nan_to_num()
    diff = (ours - ref).abs()
    step = quantization_step(ref, quantizer)
    excess = diff - (step + 2e-2 * ref.abs())
    beyond = excess > 0
    worst = int(excess.argmax())
    return {
        "elements": diff.numel(),
        "equal": int((diff == 0).sum()),
        "one_step": int(((diff > 0) & ~beyond).sum()),
        "beyond": int(beyond.sum()),
        "nan_one_side": nan_one_side,
        "worst_steps": float((diff / step).max()),
        "worst": {
            "row": worst // ours.shape[-1],
            "column": worst % ours.shape[-1],
            "ours": float(ours.view(-1)[worst]),
            "reference": float(ref.view(-1)[worst]),
        },
    }


def check_quantized(out: torch.Tensor, reference: torch.Tensor, quantizer: Quantizer, what: str) -> dict[str, Any]:
    """Dequantized, within one quantization step plus 2e-2 of the reference's (the benchmark's check_close), and NaN
    exactly where the reference's is; the agreement, when it holds."""
    agreement = quantized_agreement(out, reference, quantizer)
    if agreement["nan_one_side"]:
        raise AssertionError(f"{what}: NaN where the reference has none, or the reverse (unwritten poison?)")
    if agreement["beyond"]:
        raise AssertionError(f"{what}: dequantized values off the reference by more than a step and 2e-2: {agreement}")
    return agreement


def poisoned_codes(shape: tuple[int, ...], quantizer: Quantizer) -> torch.Tensor:
    """A quantized output filled with E4M3FN's NaN code (0x7F; INT8's 127)."""
    out = torch.empty(shape, device="cuda", dtype=QUANT_TORCH_DTYPES[quantizer.dtype])
    out.view(torch.uint8).fill_(0x7F)
    return out


@dataclass(frozen=True)
class _Kind:
    """One kernel of the section: its spec for an output quantizer, whether it adds a residual (x and the residual
    in, y and h out) or not (x in, y out), and what it is checked and timed against, the reference and torch.compile's
    formula (both given the activations, then the weight; y first)."""

    spec: Callable[[int, Quantizer], RmsNormSpec]
    add: bool
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    baseline: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]

    def kernel(self, hidden: int, quantizer: Quantizer) -> RmsNormKernel:
        spec = self.spec(hidden, quantizer)
        return get_add_rms_norm(spec) if self.add else get_rms_norm(spec)

    def activations(self, rows: int, hidden: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(1 + self.add))

    def outputs(self, rows: int, hidden: int, quantizer: Quantizer) -> tuple[torch.Tensor, ...]:
        """y's codes and h, poisoned: E4M3FN's (INT8's) NaN code, NaN."""
        h = (torch.full((rows, hidden), float("nan"), device="cuda", dtype=torch.bfloat16),) if self.add else ()
        return poisoned_codes((rows, hidden), quantizer), *h


_KINDS = {
    "norm": _Kind(norm_spec, False, norm_reference, norm_quant),
    "add_norm": _Kind(add_norm_spec, True, add_norm_reference, add_norm_quant),
}


def _codes(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """y of what a reference or a baseline returns: y, or (y, h)."""
    return out[0] if isinstance(out, tuple) else out


def bench_prefill(rows: int, hidden: int, kind: str, name: str, compiled: bool, copy_gbs: float) -> dict[str, Any]:
    """Bytes: x read, y (1 byte) written, the weight once: 3 bytes per element; the add+norm's residual read and h
    (bf16) written too: 7. The plain norm is also timed unfused, our plain kernel and then torch.compile's
    quantize."""
    quantizer, of = OUTPUTS[name], _KINDS[kind]
    kernel = of.kernel(hidden, quantizer)
    kernel.warm_up(rows)
    nbytes = rows * hidden * (7 if of.add else 3) + hidden * 2
    n_sets = input_sets(nbytes)
    ins = [of.activations(rows, hidden) for _ in range(n_sets)]
    outs = [of.outputs(rows, hidden, quantizer) for _ in range(n_sets)]
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    row: dict[str, Any] = {"shape": f"{rows}x{hidden}", "out": name, "bytes": nbytes}
    row["same_size_copy_us"] = same_size_copy_us(nbytes)
    row["ours_us"] = median_event_us(lambda i: kernel(*ins[i], w, *outs[i]), n_sets)
    reference = of.reference(*ins[0], w, LLAMA, quant=kernel.spec.quant)
    what = f"ours {'add ' if of.add else ''}{row['shape']}"
    row["ours_agreement"] = check_quantized(outs[0][0], _codes(reference), quantizer, f"{what} {name}")
    if of.add and not torch.equal(outs[0][1], reference[1]):
        raise AssertionError(f"{what}: h differs from D(x + residual)")
    if not of.add:
        plain = get_rms_norm(RmsNormSpec(hidden, "bfloat16", "bfloat16", LLAMA))
        plain.warm_up(rows)
        quantize = fresh_compile(functools.partial(torch_quantize, quantizer=quantizer))
        row["separate_us"] = median_event_us(lambda i: quantize(plain(*ins[i], w)), n_sets)
    row["ours_us_again"] = median_event_us(lambda i: kernel(*ins[i], w, *outs[i]), n_sets)
    if compiled:
        fn = fresh_compile(functools.partial(of.baseline, quantizer=quantizer))
        row["compile_agreement"] = quantized_agreement(_codes(fn(*ins[0], w)), _codes(reference), quantizer)
        row["compile_us"] = median_event_us(lambda i: fn(*ins[i], w), n_sets)
    _add_pct(row, copy_gbs)
    return row


def _add_pct(row: dict[str, Any], copy_gbs: float) -> None:
    for key in ("ours", "ours_again", "separate", "compile"):
        if f"{key}_us" in row:
            row[f"{key}_pct_copy"] = 100 * row["bytes"] / row[f"{key}_us"] / 1e3 / copy_gbs
    row["ours_pct_same_size_copy"] = 100 * row["same_size_copy_us"] / min(row["ours_us"], row["ours_us_again"])


def bench_decode(rows: int, kind: str, name: str, compiled: bool) -> dict[str, Any]:
    """µs per call in CUDA-graph replay, ours as the plugins launch it (raw pointers, the captured stream)."""
    quantizer, hidden, of = OUTPUTS[name], DECODE_HIDDEN, _KINDS[kind]
    ins = of.activations(rows, hidden)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    outs = of.outputs(rows, hidden, quantizer)
    row: dict[str, Any] = {"rows": rows, "kind": kind, "out": name}
    kernel = of.kernel(hidden, quantizer)
    pointers = tuple(tensor.data_ptr() for tensor in (*ins, w, *outs))
    reference = _codes(of.reference(*ins, w, LLAMA, quant=kernel.spec.quant))
    kernel.warm_up(rows)

    def raw_launch() -> None:
        kernel.launch(*pointers, rows, torch.cuda.current_stream().cuda_stream)

    row["ours_graph_us"] = graph_replay_us(raw_launch)
    row["ours_agreement"] = check_quantized(outs[0], reference, quantizer, f"decode {kind} rows={rows} {name}")
    row["ours_graph_us_again"] = graph_replay_us(raw_launch)
    if compiled:
        fn = fresh_compile(functools.partial(of.baseline, quantizer=quantizer))
        row["compile_agreement"] = quantized_agreement(_codes(fn(*ins, w)), reference, quantizer)
        row["compile_graph_us"] = graph_replay_us(lambda: fn(*ins, w))
    return row


def qk_norm_quant(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, quant: QuantParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q and k norms, then each one's quantize: the formula torch.compile gets to fuse."""
    return (
        torch_quantize(llama_rms_norm(q, wq), quant.q_output),
        torch_quantize(llama_rms_norm(k, wk), quant.k_output),
    )


def bench_qk_quant(tokens: int, compiled: bool) -> dict[str, Any]:
    """µs per call of the quantized QK-norm (one launch, both outputs INT8) at QK_HEADS, beside our plain QK-norm
    followed by torch.compile's two quantizes, and torch.compile's fused norms and quantizes: CUDA-graph replay up
    to 32 tokens, event-timed medians over fresh inputs beyond."""
    q_heads, k_heads, head_dim = QK_HEADS
    spec = QkNormSpec(head_dim, head_dim, "bfloat16", "bfloat16", LLAMA, quant=QK_QUANT)
    kernel, plain = get_qk_norm(spec), get_qk_norm(dataclasses.replace(spec, quant=None))
    kernel.warm_up(tokens * q_heads)
    plain.warm_up(tokens * q_heads)
    quantizers = (QK_QUANT.q_output, QK_QUANT.k_output)
    nbytes = 3 * tokens * (q_heads + k_heads) * head_dim + 2 * 2 * head_dim
    small = tokens <= 32
    n_sets = 1 if small else input_sets(nbytes)
    shapes = ((tokens, q_heads, head_dim), (tokens, k_heads, head_dim))
    ins = [tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for shape in shapes) for _ in range(n_sets)]
    outs = [tuple(poisoned_codes(shape, quantizer) for shape, quantizer in zip(shapes, quantizers, strict=True))]
    outs += [tuple(torch.empty_like(out) for out in outs[0]) for _ in range(n_sets - 1)]
    plain_outs = [tuple(torch.empty_like(x) for x in pair) for pair in ins]
    wq, wk = (torch.randn(head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    quantize = [fresh_compile(functools.partial(torch_quantize, quantizer=quantizer)) for quantizer in quantizers]

    def ours(i: int) -> None:
        kernel(*ins[i], wq, wk, *outs[i])

    def separate(i: int) -> None:
        q_out, k_out = plain(*ins[i], wq, wk, *plain_outs[i])
        quantize[0](q_out)
        quantize[1](k_out)

    timed = {"ours_us": ours, "separate_us": separate}
    if compiled:
        fn = fresh_compile(functools.partial(qk_norm_quant, quant=QK_QUANT))
        timed["compile_us"] = lambda i: fn(*ins[i], wq, wk)
    row: dict[str, Any] = {"tokens": tokens, "bytes": nbytes, "timing": "graph" if small else "events"}
    for key, call in timed.items():
        row[key] = graph_replay_us(lambda call=call: call(0)) if small else median_event_us(call, n_sets)
    ours(0)
    for part, (x, w, quantizer) in enumerate(zip(ins[0], (wq, wk), quantizers, strict=True)):
        reference = norm_reference(x, w, LLAMA, quant=spec.part_quant(part))
        row[f"{'qk'[part]}_agreement"] = check_quantized(outs[0][part], reference, quantizer, f"qk tokens={tokens}")
    return row


def _time_tiling(kind: str, spec: RmsNormSpec | AddRmsNormSpec, tiling: RowTiling, rows: int, n_sets: int) -> float:
    """One tiling of `spec` compiled and launched as the plugins launch (raw pointers): checked, then timed (events
    over rotating inputs for many rows, graph replay for one)."""
    of, quantizer = _KINDS[kind], spec.quant.output
    variant_type = AddRmsNormVariant if of.add else RmsNormVariant
    call = shared_cache().get(variant_type(spec, tiling, of.kernel(spec.hidden, quantizer).device.arch))
    ins = [of.activations(rows, spec.hidden) for _ in range(n_sets)]
    outs = [of.outputs(rows, spec.hidden, quantizer) for _ in range(n_sets)]
    w = torch.randn(spec.hidden, device="cuda", dtype=torch.bfloat16)

    def launch(i: int) -> None:
        pointers = (tensor.data_ptr() for tensor in (*ins[i], w, *outs[i]))
        call(*pointers, rows, torch.cuda.current_stream().cuda_stream)

    launch(0)
    torch.cuda.synchronize()
    reference = _codes(of.reference(*ins[0], w, LLAMA, quant=spec.quant))
    check_quantized(outs[0][0], reference, quantizer, f"{tiling}")
    return median_event_us(launch, n_sets) if n_sets > 1 else graph_replay_us(lambda: launch(0))


# The tilings measured beside the rule: (kernel, regime, rows, hidden) and the vectors per thread tried.
TILING_CASES = (
    ("norm", Regime.PREFILL, 16384, 4096, (1, 2, 4)),
    ("norm", Regime.PREFILL, 16384, 2048, (1, 2, 4)),
    ("norm", Regime.PREFILL, 8192, 8192, (1, 2, 4)),
    ("add_norm", Regime.PREFILL, 16384, 4096, (1, 2)),
    ("norm", Regime.DECODE, 1, 4096, (1, 2, 4)),
    ("add_norm", Regime.DECODE, 1, 4096, (1, 2, 4)),
)


def bench_tilings() -> list[dict[str, Any]]:
    """The 1-byte-y tiling rule against its neighbours (-> FP8, bf16 rows): the same row over threads holding 1, 2
    or 4 vectors of 16."""
    quantizer = OUTPUTS["fp8"]
    results = []
    for kind, regime, rows, hidden, per_thread in TILING_CASES:
        spec = _KINDS[kind].spec(hidden, quantizer)
        rule = rms_norm_tiling(spec, regime, aligned=True)
        bytes_per_row = hidden * (7 if _KINDS[kind].add else 3)
        n_sets = input_sets(rows * bytes_per_row) if regime is Regime.PREFILL else 1
        for vectors in per_thread:
            threads = rule.threads_per_row * rule.vectors_per_thread // vectors
            rows_per_block = max(1, PREFILL_BLOCK_THREADS // threads) if regime is Regime.PREFILL else 1
            tiling = dataclasses.replace(
                rule, threads_per_row=threads, vectors_per_thread=vectors, rows_per_block=rows_per_block
            )
            results.append(
                {
                    "kind": kind,
                    "regime": regime.value,
                    "rows": rows,
                    "hidden": hidden,
                    "threads_per_row": threads,
                    "vectors_per_thread": vectors,
                    "rule": tiling == rule,
                    "us": _time_tiling(kind, spec, tiling, rows, n_sets),
                }
            )
    return results


def run_quant(compiled: bool, copy_gbs: float) -> dict[str, Any]:
    return {
        "quant_norm_prefill": [
            bench_prefill(rows, hidden, "norm", name, compiled, copy_gbs)
            for name in OUTPUTS
            for rows, hidden in PREFILL_SHAPES
        ],
        "quant_add_norm_prefill": [
            bench_prefill(rows, hidden, "add_norm", name, compiled, copy_gbs)
            for name in OUTPUTS
            for rows, hidden in ADD_SHAPES
        ],
        "quant_decode": [
            bench_decode(rows, kind, name, compiled)
            for kind in ("norm", "add_norm")
            for name in OUTPUTS
            for rows in DECODE_ROWS
        ],
        "quant_tilings": bench_tilings(),
        "quant_qk_norm": [bench_qk_quant(tokens, compiled) for tokens in QK_QUANT_TOKENS],
    }


def quant_target_checks(report: dict[str, Any]) -> list[tuple[str, bool]]:
    """The quantized kernels' targets (issue 22; docs/performance.md), each with whether this run met it."""
    checks = []
    for r in report.get("quant_norm_prefill", []):
        ours = min(r["ours_us"], r["ours_us_again"])
        if r["shape"] == TARGET_SHAPE:
            checks.append((f"norm->{r['out']} {TARGET_SHAPE} <= {NORM_TARGET_US} µs", ours <= NORM_TARGET_US))
            checks.append(
                (
                    f"norm->{r['out']} {TARGET_SHAPE} >= {NORM_TARGET_PCT}% of the same-size copy",
                    r["ours_pct_same_size_copy"] >= NORM_TARGET_PCT,
                )
            )
        if "compile_us" in r:
            checks.append((f"norm->{r['out']} {r['shape']} faster than torch.compile", ours < r["compile_us"]))
    for r in report.get("quant_add_norm_prefill", []):
        if r["shape"] == TARGET_SHAPE:
            ours = min(r["ours_us"], r["ours_us_again"])
            checks.append(
                (f"add-norm(fake-quant)->{r['out']} {TARGET_SHAPE} <= {ADD_TARGET_US} µs", ours <= ADD_TARGET_US)
            )
    for r in report.get("quant_decode", []):
        goal = DECODE_TARGET_US[r["rows"]]
        ours = min(r["ours_graph_us"], r["ours_graph_us_again"])
        checks.append((f"decode {r['kind']}->{r['out']} rows={r['rows']} <= {goal} µs", ours <= goal))
    for r in report.get("quant_qk_norm", []):
        faster = r["ours_us"] < r["separate_us"]
        checks.append((f"qk-norm->int8 tokens={r['tokens']} faster than the qk-norm, then 2 quantizes", faster))
    return checks


def _compile_cell(row: dict[str, Any], key: str, label: str, spec: str) -> str:
    """torch.compile's time in a report line (nothing where --no-torch-compile skipped it), with its codes against
    the reference's where they are off by more than one step."""
    if key not in row:
        return ""
    agreement, off = row["compile_agreement"], ""
    if agreement["beyond"] or agreement["nan_one_side"]:
        off = f" (off: {agreement['beyond']} beyond a step, worst {agreement['worst_steps']:.1f} steps)"
    return f"{label} {row[key]:{spec}}{off}"


def _prefill_line(row: dict[str, Any], label: str, shape_width: int) -> str:
    line = f"  {label}->{row['out']:<4} {row['shape']:>{shape_width}} | copy {row['same_size_copy_us']:6.1f}"
    line += (
        f" | ours {row['ours_us']:6.1f} {row['ours_us_again']:6.1f} ({row['ours_pct_same_size_copy']:5.1f}% of copy)"
    )
    separate = f" | norm+Q {row['separate_us']:6.1f}" if "separate_us" in row else ""
    return line + separate + _compile_cell(row, "compile_us", " | compile", "6.1f")


def print_quant_report(report: dict[str, Any]) -> None:
    print("\nQuantized norms, bf16 rows (Llama), event-timed medians, µs and % of the copy bandwidth")
    print("('ours' twice: first and last timing; 'copy' = the same-size copy; 'norm+Q' = our plain norm, then")
    print(" torch.compile's quantize; 'compile' = torch.compile of the norm and the quantize, one fused kernel;")
    print(" 'off' = torch.compile's codes more than one quantization step from the reference's, which ours never are)")
    for r in report["quant_norm_prefill"]:
        print(_prefill_line(r, "norm", 11))
    for r in report["quant_add_norm_prefill"]:
        print(_prefill_line(r, "add(fq)", 9))
    print(f"\nQuantized decode, bf16, H={DECODE_HIDDEN}: µs per call in CUDA-graph replay")
    for r in report["quant_decode"]:
        ours = f"ours {r['ours_graph_us']:.2f} / {r['ours_graph_us_again']:.2f}"
        compiled = _compile_cell(r, "compile_graph_us", "  torch.compile", ".2f")
        print(f"  {r['kind']:>8}->{r['out']:<4} rows {r['rows']:>3}: {ours}{compiled}")
    q_heads, k_heads, head_dim = QK_HEADS
    print(
        f"\nQuantized QK-norm -> int8 (each output its own scale), bf16, {q_heads} q / {k_heads} k heads of {head_dim}"
    )
    for r in report.get("quant_qk_norm", []):
        compiled = f" | compile {r['compile_us']:.2f}" if "compile_us" in r else ""
        print(
            f"  tokens {r['tokens']:>5} ({r['timing']}): ours {r['ours_us']:.2f} | qk-norm+2 Q {r['separate_us']:.2f}"
            f"{compiled} µs"
        )
    print("\nTiling of a 1-byte y (-> fp8, bf16 rows): vectors of 16 per thread, µs ('*' = the rule)")
    for r in report["quant_tilings"]:
        mark = "*" if r["rule"] else " "
        print(
            f"  {r['kind']:>8} {r['regime']:>7} {r['rows']:>5}x{r['hidden']:<5}: {r['threads_per_row']:>4} threads x"
            f" {r['vectors_per_thread']} vectors {r['us']:7.2f}{mark}"
        )
