"""AOT kernel artifacts launched with the bare CUDA driver (issue 9): the GPU run of `trtfuse.bench.aot`
(compile in one process, check in another that imports no CuTeDSL or TVM-FFI), and its CPU-testable parts."""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.aot.cases import NULL_POINTER_CASES, LaunchCase, launch_cases  # noqa: E402  (imports torch)
from trtfuse.bench.aot.check import CaseResult, check_artifacts, print_check  # noqa: E402
from trtfuse.bench.aot.compare import compare_part  # noqa: E402
from trtfuse.bench.aot.driver import module_image  # noqa: E402
from trtfuse.bench.aot.isolation import ImportBlocker  # noqa: E402
from trtfuse.bench.aot.manifest import (  # noqa: E402
    MANIFEST,
    MANIFEST_FORMAT,
    BadArtifactFolder,
    manifest_item,
    read_artifact,
    read_manifest,
    spec_from_json,
    spec_to_json,
    write_artifact,
)
from trtfuse.bench.aot.matrix import (  # noqa: E402
    MatrixEntry,
    Spec,
    entry_name,
    kind_of,
    matrix,
    part_pointers,
    part_rows,
)
from trtfuse.bench.aot.params import PackedParams, argument_values, pack_params, pointer_names  # noqa: E402
from trtfuse.bench.aot.tensors import EXACT_MAX_HIDDEN, CaseTensors, PartTensors  # noqa: E402
from trtfuse.bench.reference import add_norm_reference, norm_reference, qk_norm_rope_reference  # noqa: E402
from trtfuse.contract import NormParams, WeightMode  # noqa: E402
from trtfuse.kernels.declaration import (  # noqa: E402
    ROPE_EXTENTS,
    LaunchDeclaration,
    RowPart,
    Tactic,
    add_rms_norm_params,
    qk_norm_params,
    qk_norm_rope_params,
    rms_norm_params,
)

from support.paths import REPO_ROOT  # noqa: E402

REPO = REPO_ROOT
# Both steps must end well inside the device's 10-minute limit per command, which `.ci/gpu tests` shares.
COMPILE_TIMEOUT_S = 240
CHECK_TIMEOUT_S = 400
# A folder of artifacts compiled elsewhere (`python -m trtfuse.bench.aot compile --out DIR` on a CPU machine) to check
# instead of compiling here: PTX from another CuTeDSL build may have an ISA this machine's driver knows.
ARTIFACTS_ENV = "TRTFUSE_AOT_ARTIFACTS"


def rms_declaration(hidden: int = 4096, rows_per_block: int = 1) -> LaunchDeclaration:
    parts = (RowPart("x", hidden, rows_per_block),)
    return LaunchDeclaration("trtfuse_rms_0", "sm_90a", Tactic.PREFILL, 256, 32, rms_norm_params(), parts)


def qk_declaration(rows_per_block: int = 8) -> LaunchDeclaration:
    parts = (RowPart("q", 128, rows_per_block), RowPart("k", 128, rows_per_block))
    return LaunchDeclaration("trtfuse_qk_0", "sm_90a", Tactic.PREFILL, 128, 64, qk_norm_params(), parts)


def add_declaration(hidden: int = 64, rows_per_block: int = 1) -> LaunchDeclaration:
    parts = (RowPart("x", hidden, rows_per_block),)
    return LaunchDeclaration("trtfuse_add_0", "sm_90a", Tactic.PREFILL, 256, 32, add_rms_norm_params(), parts)


def rms_entry(dtype: str = "bfloat16", weight_dtype: str | None = "float32", out: str | None = None) -> MatrixEntry:
    from trtfuse.kernels.specs import RmsNormSpec

    mode = WeightMode.AFTER_CAST if weight_dtype else WeightMode.NONE
    return MatrixEntry(RmsNormSpec(64, dtype, weight_dtype, NormParams(1e-6, 0.0, mode), out))


def qk_entry() -> MatrixEntry:
    from trtfuse.kernels.specs import QkNormSpec

    spec = QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, WeightMode.AFTER_CAST))
    return MatrixEntry(spec, (4, 2))


def add_entry(dtype: str = "bfloat16", weight_dtype: str | None = "float32", out: str | None = None) -> MatrixEntry:
    from trtfuse.kernels.specs import AddRmsNormSpec

    mode = WeightMode.AFTER_CAST if weight_dtype else WeightMode.NONE
    return MatrixEntry(AddRmsNormSpec(64, dtype, weight_dtype, NormParams(1e-6, 0.0, mode), out))


def rope_declaration(rows_per_block: int = 8) -> LaunchDeclaration:
    parts = (RowPart("q", 128, rows_per_block), RowPart("k", 128, rows_per_block))
    params = qk_norm_rope_params()
    return LaunchDeclaration("tf_rope_0", "sm_90a", Tactic.PREFILL, 128, 64, params, parts, ROPE_EXTENTS)


def rope_entry(layout: str = "token_major", rotation: str = "half", rotary: int = 128) -> MatrixEntry:
    from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams

    rope = RopeParams(128, rotary, rotation, layout)
    params = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
    return MatrixEntry(QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", params, rope=rope), (4, 2))


def declaration_for(entry: MatrixEntry) -> LaunchDeclaration:
    """The stand-in declaration of an entry of `rms_entry`, `add_entry`, `qk_entry` or `rope_entry`."""
    declarations = {
        "rms_norm": rms_declaration(64),
        "add_rms_norm": add_declaration(64),
        "qk_norm": qk_declaration(),
        "qk_norm_rope": rope_declaration(),
    }
    return declarations[entry.kind.name]


# --- CPU: kernel arguments -----------------------------------------------------------------------------------------


def values_the_driver_reads(packed: PackedParams) -> list[int]:
    """Each parameter's value read as cuLaunchKernel reads it: through the pointer array at `packed.address`."""
    pointers = (ctypes.c_void_p * len(packed.values)).from_address(packed.address)
    return [type(value).from_address(pointer).value for value, pointer in zip(packed.values, pointers, strict=True)]


def test_rms_norm_arguments_follow_the_declared_parameter_order() -> None:
    declaration = rms_declaration()
    pointers = {"x": 0x7F00_0000_1000, "weight": 0x7F00_0000_2002, "y": 0xFFFF_FFFF_FFFF_FFF0}
    values = argument_values(declaration, pointers, (77,))
    assert values == [pointers["x"], pointers["weight"], 77, pointers["y"]]
    packed = pack_params(declaration, values)
    assert values_the_driver_reads(packed) == values
    # u64 for pointers and u32 for the scalar: the sizes the PTX entry's .param types take.
    assert [ctypes.sizeof(v) for v in packed.values] == [8, 8, 4, 8]
    assert [p.ptx_type for p in declaration.params] == [".u64", ".u64", ".u32", ".u64"]


def test_qk_norm_arguments_carry_both_row_counts_and_the_q_block_count() -> None:
    declaration = qk_declaration(rows_per_block=8)
    names = ("q", "k", "q_weight", "k_weight", "q_out", "k_out")
    pointers = {name: 0x1000 * (i + 1) for i, name in enumerate(names)}
    values = argument_values(declaration, pointers, (33 * 4, 33 * 2))
    q_blocks = -(-33 * 4 // 8)
    assert values == [0x1000, 0x2000, 0x3000, 0x4000, 132, 66, q_blocks, 0x5000, 0x6000]
    assert values_the_driver_reads(pack_params(declaration, values)) == values
    assert declaration.grid_x((132, 66)) == q_blocks + -(-66 // 8)


def test_add_rms_norm_arguments_put_the_row_count_between_the_inputs_and_both_outputs() -> None:
    """Six parameters: x, residual, weight as inputs, the row count, then y and h (TensorRT's order)."""
    declaration = add_declaration()
    names = ("x", "residual", "weight", "y", "h")
    pointers = {name: 0x7F00_0000_1000 * (i + 1) + 2 * i + 1 for i, name in enumerate(names)}  # odd addresses
    values = argument_values(declaration, pointers, (4097,))
    assert values == [pointers["x"], pointers["residual"], pointers["weight"], 4097, pointers["y"], pointers["h"]]
    packed = pack_params(declaration, values)
    assert values_the_driver_reads(packed) == values
    assert [ctypes.sizeof(v) for v in packed.values] == [8, 8, 8, 4, 8, 8]
    assert [p.ptx_type for p in declaration.params] == [".u64", ".u64", ".u64", ".u32", ".u64", ".u64"]
    assert declaration.grid_x((4097,)) == 4097 and declaration.grid_x((0,)) == 1
    # RMSNorm's pointers alone are not enough: the residual and h are parameters too.
    with pytest.raises(ValueError, match="takes pointers"):
        argument_values(declaration, {"x": 1, "weight": 2, "y": 3}, (1,))


def test_arguments_reject_missing_or_unknown_pointers_and_values_out_of_range() -> None:
    declaration = rms_declaration()
    with pytest.raises(ValueError, match="takes pointers"):
        argument_values(declaration, {"x": 1, "y": 2}, (1,))
    with pytest.raises(ValueError, match="takes pointers"):
        argument_values(declaration, {"x": 1, "weight": 2, "y": 3, "z": 4}, (1,))
    with pytest.raises(ValueError, match=r"does not fit \.u32"):
        pack_params(declaration, [1, 2, 1 << 32, 3])
    with pytest.raises(ValueError, match=r"does not fit \.u64"):
        pack_params(declaration, [-1, 2, 1, 3])
    with pytest.raises(ValueError, match="4 parameters"):
        pack_params(declaration, [1, 2, 3])


def test_artifacts_round_trip_through_their_files(tmp_path: Path) -> None:
    from trtfuse.kernels.declaration import KernelArtifact

    artifact = KernelArtifact(qk_declaration(), ".version 8.8\n.entry trtfuse_qk_0()\n", b"\x7fELF\x00\x01")
    write_artifact(tmp_path, "a", artifact)
    assert read_artifact(tmp_path, "a") == artifact
    image = module_image(artifact, "ptx")
    assert image == artifact.ptx.encode() + b"\0" and image.count(b"\0") == 1  # cuModuleLoadData reads PTX to NUL
    assert module_image(artifact, "cubin") == artifact.cubin
    with pytest.raises(FileNotFoundError, match=r"b\.json"):
        read_artifact(tmp_path, "b")


def test_a_manifest_of_the_old_format_or_an_unknown_kind_is_refused_in_one_line(tmp_path: Path) -> None:
    """Format 1 kept the kind inside the spec and had no add+norm entries: a check of such a folder would pass
    without launching any, so the reader names both formats and the command that writes a new folder."""
    old_item = {"spec": spec_to_json(rms_entry().spec) | {"kind": "rms_norm"}, "heads": None, "stems": {}}
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 1, "arch": "sm_90a", "entries": [old_item]}))
    with pytest.raises(BadArtifactFolder) as refused:
        read_manifest(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "manifest format 1, this check reads format 2" in message
    assert f"python -m trtfuse.bench.aot compile --out {tmp_path}" in message and MANIFEST_FORMAT == 2
    unknown = manifest_item(rms_entry(), {"PREFILL": "e0"}) | {"kind": "layer_norm"}
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 2, "arch": "sm_90a", "entries": [unknown]}))
    with pytest.raises(BadArtifactFolder, match="kernel kind 'layer_norm' is not one of"):
        read_manifest(tmp_path)


# --- CPU: the matrix and the cases -----------------------------------------------------------------------------------


def parametrized_arguments(module: object) -> Iterator[dict[str, object]]:
    """Every combination of arguments the parametrize marks of `module`'s test functions run."""
    for _, function in inspect.getmembers(module, inspect.isfunction):
        marks = [m for m in getattr(function, "pytestmark", []) if m.name == "parametrize"]
        grids = []
        for mark in marks:
            names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
            grids.append([dict(zip(names, v if len(names) > 1 else (v,), strict=True)) for v in mark.args[1]])
        for combination in itertools.product(*grids):
            yield {k: v for part in combination for k, v in part.items()}


def kernel_test_specs() -> tuple[set[object], set[tuple[object, tuple[int, int]]]]:
    """Every RMSNorm spec and every (QK-norm spec, heads) tests/gpu/test_kernels_gpu.py runs, read from its lists and
    its parametrize marks."""
    pytest.importorskip("cutlass", reason="tests/gpu/test_kernels_gpu.py needs nvidia-cutlass-dsl to import")
    sys.path.insert(0, str(REPO / "tests"))
    import test_kernels_gpu as kernel_tests

    from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec

    rms: set[object] = set(kernel_tests.DTYPE_PAIR_SPECS) | set(kernel_tests.MIXED_SPECS)
    qk = {(spec, (q, k)) for _, spec, q, k in kernel_tests.QK_CASES}
    for args in parametrized_arguments(kernel_tests):
        if isinstance(args.get("spec"), RmsNormSpec):
            rms.add(args["spec"])
        elif isinstance(args.get("spec"), QkNormSpec) and "q_heads" in args:
            qk.add((args["spec"], (args["q_heads"], args["k_heads"])))
        elif isinstance(args.get("spec"), QkNormSpec):  # test_mixed_precision_qk_norm's heads
            spec = args["spec"]
            qk.add((spec, (32, 8) if spec.q_hidden <= 256 else (1, 1)))
        elif "hidden" in args and "mode" in args:
            params = NormParams(1e-6, args["offset"], args["mode"])
            rms.add(RmsNormSpec(args["hidden"], args["dtype"], args["weight_dtype"], params))
        elif "hidden" in args and "out_dtype" in args:
            dtype, out = args["dtype"], args["out_dtype"]
            weight = dtype if dtype != "float32" else out
            params = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
            rms.add(RmsNormSpec(args["hidden"], dtype, weight, params, out))
    return rms, qk


def test_the_matrix_covers_every_spec_of_the_kernel_gpu_tests() -> None:
    rms, qk = kernel_test_specs()
    entries = matrix()
    assert len(entries) == len(set(entries))
    covered_rms = {e.spec for e in entries if e.kind.name == "rms_norm"}
    covered_qk = {(e.spec, e.heads) for e in entries if e.kind.name == "qk_norm"}
    assert rms - covered_rms == set()
    assert qk - covered_qk == set()
    modes = {e.spec.params.weight_mode for e in entries}
    assert modes == set(WeightMode)


def add_norm_test_specs() -> set[object]:
    """Every add+norm spec tests/gpu/test_add_norm_gpu.py runs with its own list or its parametrize marks."""
    pytest.importorskip("cutlass", reason="tests/gpu/test_add_norm_gpu.py needs nvidia-cutlass-dsl to import")
    import test_add_norm_gpu as add_tests

    from trtfuse.kernels.specs import AddRmsNormSpec

    specs: set[object] = set(add_tests.EVERY_PAIR_AND_WEIGHT)
    for args in parametrized_arguments(add_tests):
        if isinstance(args.get("spec"), AddRmsNormSpec):
            specs.add(args["spec"])
        elif "hidden" in args:
            params = NormParams(1e-6, args["offset"], args["mode"])
            specs.add(AddRmsNormSpec(args["hidden"], args["dtype"], args["weight_dtype"], params, args["out_dtype"]))
    return specs


def test_the_matrix_covers_every_add_norm_dtype_pair_and_weight_mode() -> None:
    """Each add+norm entry is a spec the add+norm GPU tests run (a failure replays there); together they cover
    every (D, T) pair in both weight modes with a weight, weight mode NONE for every D, every weight dtype in each
    mode that has one, a ragged row, a row no vector divides, rows packed several to a block, and both tactics."""
    from trtfuse.kernels.api import rms_norm_tiling
    from trtfuse.kernels.artifacts import add_rms_norm_tactics
    from trtfuse.kernels.tiling import Regime

    specs = add_norm_test_specs()
    entries = [e for e in matrix() if e.kind.name == "add_rms_norm" and e.spec.quant is None]
    assert entries and all(e.heads is None for e in entries)
    assert {e.spec for e in entries} <= specs

    def pair_and_mode(spec: object) -> tuple[str, str, WeightMode]:
        return spec.dtype, spec.out_dtype, spec.params.weight_mode

    weighted = {pair_and_mode(s) for s in specs if s.hidden == 4096 and s.weight_dtype is not None}
    assert len(weighted) == 7 * 2 and weighted <= {pair_and_mode(e.spec) for e in entries}
    none = {e.spec.dtype for e in entries if e.spec.params.weight_mode is WeightMode.NONE}
    assert none == {"float32", "float16", "bfloat16"}
    for mode in (WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST):
        weights = {e.spec.weight_dtype for e in entries if e.spec.params.weight_mode is mode}
        assert weights == {"float32", "float16", "bfloat16"}
    tilings = [(e.spec.hidden, rms_norm_tiling(e.spec, Regime.PREFILL, aligned=True)) for e in entries]
    assert any(t.vector == 1 for _, t in tilings), "a row no vector divides"
    assert any(h % (t.threads_per_row * t.vectors_per_thread * t.vector) for h, t in tilings), "a ragged row"
    assert any(t.rows_per_block > 1 for _, t in tilings) and len({h for h, _ in tilings}) >= 4
    assert {len(add_rms_norm_tactics(e.spec)) for e in entries} == {1, 2}


def test_the_matrix_covers_the_quantizer_stages() -> None:
    """Quantized entries of both kinds: the output stage in FP8 (saturating and not) and INT8, the input stage with
    and without it, 16-byte vectors and narrower ones (every AOT kernel also holds the element path, which the
    check's shifted pointers take)."""
    from trtfuse.kernels.api import rms_norm_tiling
    from trtfuse.kernels.tiling import Regime

    quantized = [e.spec for e in matrix() if getattr(e.spec, "quant", None) is not None]
    for kind in ("rms_norm", "add_rms_norm"):
        specs = [s for s in quantized if kind_of(s).name == kind]
        outputs = {(s.quant.output.dtype, s.quant.output.saturate) for s in specs if s.quant.output is not None}
        assert outputs == {("float8_e4m3fn", True), ("float8_e4m3fn", False), ("int8", True)}
        assert any(s.quant.input is not None and s.quant.output is not None for s in specs)
        vectors = {rms_norm_tiling(s, Regime.PREFILL, aligned=True).vector for s in specs}
        assert 16 in vectors and len(vectors) > 1  # 16-byte stores of y, and a row of narrower vectors
    assert any(s.quant.input is not None and s.quant.output is None for s in quantized)
    # ModelOpt INT8's inverse-root stage, of r in float32 and in float16, on RMSNorm rows the check fills with exact
    # sums of squares (`tensors.exact_square_rows`; an add+norm's h = x + residual would not keep them exact).
    rsqrt = [s for s in quantized if s.quant.rsqrt is not None]
    assert {s.quant.rsqrt.input_dtype for s in rsqrt} == {"float32", "float16"}
    assert all(kind_of(s).name == "rms_norm" and s.hidden <= EXACT_MAX_HIDDEN for s in rsqrt)


def test_the_matrix_covers_each_qk_norm_parts_own_quantizer() -> None:
    """QK-norm entries with q's and k's own output quantizers: INT8 and FP8 (saturating and not), two scales on one
    node, a part left in T beside a quantized one, head-dim rows and DeepSeek-V3-like latent widths of no power of
    two; and each part's own input and rsqrt stages (OLMo2 INT8, fp16 and fp32, q and k of different widths, each
    at its own scales); each part's tiling in its own stored dtype (16 codes a vector, 16 bytes of T)."""
    from trtfuse.kernels.api import qk_norm_tilings
    from trtfuse.kernels.specs import DTYPE_BYTES

    qk = [e.spec for e in matrix() if e.kind.name == "qk_norm" and e.spec.quant is not None]
    parts = [(s, part, s.part_quant(part)) for s in qk for part in (0, 1)]
    outputs = {(q.output.dtype, q.output.saturate) for _, _, q in parts if q is not None and q.output is not None}
    assert outputs == {("int8", True), ("float8_e4m3fn", True), ("float8_e4m3fn", False)}
    assert any(s.quant.q_output and s.quant.k_output and s.quant.q_output != s.quant.k_output for s in qk)
    assert any(q is None for _, _, q in parts) and {48, 64, 128} <= {s.q_hidden for s in qk}
    olmo2 = [s for s in qk if s.quant.q_rsqrt is not None and s.quant.k_rsqrt is not None]
    assert {s.dtype for s in olmo2} == {"float16", "float32"} and all(s.q_hidden != s.k_hidden for s in olmo2)
    assert all(s.quant.q_input.scale != s.quant.k_input.scale for s in olmo2)
    for spec, part, _quant in parts:
        tiling = qk_norm_tilings(spec, aligned=True)[part]
        assert tiling.vector * DTYPE_BYTES[spec.part_y_dtype(part)] == 16, (spec, part)


def test_quantized_buffers_hold_y_in_the_quantized_dtype_and_are_poisoned_bytewise() -> None:
    spec = next(e.spec for e in matrix() if e.spec.quant is not None and e.spec.quant.output)
    entry = MatrixEntry(spec)
    tensors = CaseTensors(entry, declaration_for(entry), LaunchCase(3), device="cpu")
    out = tensors.parts["x"].out
    assert out.element_size() == 1 and bool((out.view(torch.uint8) == 0x7F).all())
    assert tensors.parts["x"].quant == spec.quant


def test_each_qk_norm_part_holds_its_output_in_its_own_dtype_with_its_own_quantizer() -> None:
    """DeepSeek-V3-like FP8 q beside a k left in T: q_out FP8 codes poisoned bytewise, k_out bf16 NaN."""
    entry = next(e for e in matrix() if e.heads and e.spec.quant is not None and e.spec.quant.k_output is None)
    tensors = CaseTensors(entry, declaration_for(entry), LaunchCase(3), device="cpu")
    q, k = tensors.parts["q"], tensors.parts["k"]
    assert (q.quant, k.quant) == (entry.spec.part_quant(0), None) and q.quant.output == entry.spec.quant.q_output
    assert q.out.dtype == torch.float8_e4m3fn and bool((q.out.view(torch.uint8) == 0x7F).all())
    assert k.out.dtype == torch.bfloat16 and bool(torch.isnan(k.out).all())
    assert (q.out.numel(), k.out.numel()) == (3 * entry.heads[0] * entry.spec.q_hidden, 3 * entry.heads[1] * 32)


def test_rsqrt_stage_entries_get_rows_of_exact_sums_of_squares() -> None:
    """Rows of m / 128 (|m| <= 63) whose float32 sum of squares, in any order, is the float64 one, after a refresh
    too; other entries' rows are random."""
    spec = next(e.spec for e in matrix() if e.spec.quant is not None and e.spec.quant.rsqrt is not None)
    tensors = CaseTensors(MatrixEntry(spec), rms_declaration(spec.hidden), LaunchCase(5), device="cpu")
    part = tensors.parts["x"]
    for _ in range(2):
        x = part.x.view(5, spec.hidden)
        m = x.double() * 128
        assert torch.equal(m, m.round()) and int(m.abs().max()) <= 63
        squares = x.float().square()
        exact = x.double().square().sum(-1)
        assert torch.equal(squares.sum(-1).double(), exact) and torch.equal(squares.cumsum(-1)[:, -1].double(), exact)
        assert torch.equal(squares.flip(-1).cumsum(-1)[:, -1].double(), exact)
        tensors.refresh()
    plain = CaseTensors(rms_entry(), rms_declaration(64), LaunchCase(5), device="cpu").parts["x"].x.double() * 128
    assert not torch.equal(plain, plain.round())


def test_each_qk_norm_parts_rsqrt_stage_gets_rows_of_exact_sums_of_squares() -> None:
    """OLMo2's INT8 QK entries: q's and k's rows are both m / 128, each part's rsqrt stage its own."""
    entry = next(e for e in matrix() if e.heads and e.spec.quant is not None and e.spec.quant.k_rsqrt is not None)
    tensors = CaseTensors(entry, declaration_for(entry), LaunchCase(3), device="cpu")
    for part, role in enumerate(("q", "k")):
        tensors_part = tensors.parts[role]
        m = tensors_part.x.double() * 128
        assert torch.equal(m, m.round()) and int(m.abs().max()) <= 63
        assert tensors_part.quant == entry.spec.part_quant(part) and tensors_part.quant.rsqrt is not None


def test_the_matrix_specs_survive_the_manifest() -> None:
    for entry in matrix():
        item = json.loads(json.dumps(manifest_item(entry, {})))
        assert item["kind"] == entry.kind.name and "kind" not in item["spec"]
        assert spec_from_json(item["kind"], item["spec"]) == entry.spec
    names = [entry_name(e) for e in matrix()]
    assert {name.split("-")[0] for name in names} == {"rms", "addrms", "qk", "qkrope"}


def test_launch_cases_cover_the_row_counts_alignment_and_graphs() -> None:
    declaration = qk_declaration()
    cases = launch_cases(declaration, sm_count=132)
    aligned = {c.tokens for c in cases if not c.shifted and not c.graph}
    assert {0, 1, 3, 132, 4097, 16384} <= aligned
    assert not any(c.null for c in cases)
    assert [(c.tokens, c.null) for c in NULL_POINTER_CASES] == [(0, True)]
    pointers = pointer_names(declaration)
    assert set(pointers) == {"q", "k", "q_weight", "k_weight", "q_out", "k_out"}
    assert {c.shifted for c in cases if len(c.shifted) == 1} == {(name,) for name in pointers}
    assert any(c.shifted == pointers and c.tokens > 132 for c in cases)
    assert {bool(c.shifted) for c in cases if c.graph} == {False, True}
    assert part_rows(qk_entry(), 5) == (20, 10)


def test_add_norm_cases_shift_the_residual_and_h_too() -> None:
    """The shifted pointers are the declaration's: add+norm's residual and h each alone one element (an odd
    offset) off alignment, and with all five; 0 rows, the graph aligned and shifted."""
    declaration = add_declaration()
    cases = launch_cases(declaration, sm_count=132)
    pointers = pointer_names(declaration)
    assert pointers == ("x", "residual", "weight", "y", "h")
    assert {c.shifted for c in cases if len(c.shifted) == 1} == {(name,) for name in pointers}
    assert [c.tokens for c in cases if c.shifted == pointers and not c.graph] == [1, 133, 4097]
    assert 0 in {c.tokens for c in cases if not c.shifted} and {c.shifted for c in cases if c.graph} == {(), pointers}
    assert part_rows(add_entry(), 5) == (5,)


def test_shifted_pointers_are_one_element_past_an_aligned_allocation() -> None:
    entry = rms_entry("float16", "float32", "float32")
    case = LaunchCase(3, ("x", "weight", "y"))
    tensors = CaseTensors(entry, rms_declaration(64), case, device="cpu")
    pointers = tensors.pointers()
    part = tensors.parts["x"]
    assert pointers["x"] % 16 == 2 and pointers["weight"] % 16 == 4 and pointers["y"] % 16 == 4
    assert part.x.untyped_storage().data_ptr() + 2 == pointers["x"]
    assert part.out.untyped_storage().data_ptr() + 4 == pointers["y"]
    aligned = CaseTensors(entry, rms_declaration(64), LaunchCase(3, ("weight",)), device="cpu").pointers()
    assert aligned["x"] % 16 == 0 and aligned["y"] % 16 == 0 and aligned["weight"] % 16 == 4
    assert bool(torch.isnan(part.out).all())


def test_add_norm_buffers_follow_the_declaration_with_h_in_the_activation_dtype() -> None:
    """fp32 x and residual (h fp32 too) with an fp16 y: the residual and h one fp32 element off, x and y aligned;
    inputs random, both outputs poisoned, every pointer of the declaration given."""
    entry = add_entry("float32", "float16", "float16")
    tensors = CaseTensors(entry, add_declaration(64), LaunchCase(3, ("residual", "h")), device="cpu")
    pointers = tensors.pointers()
    part = tensors.parts["x"]
    assert set(pointers) == set(pointer_names(add_declaration()))
    assert pointers["residual"] % 16 == 4 and pointers["h"] % 16 == 4
    assert pointers["x"] % 16 == 0 and pointers["y"] % 16 == 0 and pointers["weight"] % 16 == 0
    assert part.residual.untyped_storage().data_ptr() + 4 == pointers["residual"]
    assert part.h.dtype == part.x.dtype == part.residual.dtype == torch.float32 and part.out.dtype == torch.float16
    assert bool(torch.isfinite(part.residual).all()) and not torch.equal(part.residual, part.x)
    assert bool(torch.isnan(part.h).all()) and bool(torch.isnan(part.out).all())
    residual = part.residual.clone()
    part.h.zero_()
    tensors.refresh()
    assert not torch.equal(part.residual, residual) and bool(torch.isnan(part.h).all())
    bf16 = CaseTensors(add_entry("bfloat16"), add_declaration(64), LaunchCase(1, ("h",)), device="cpu").pointers()
    assert bf16["h"] % 16 == 2 and bf16["residual"] % 16 == 0
    # A table that misses a declared pointer is an error, not a 0 launched in its place.
    with pytest.raises(ValueError, match="declares pointers"):
        CaseTensors(rms_entry(), add_declaration(64), LaunchCase(3), device="cpu")


def test_rope_arguments_carry_the_extents_between_the_row_counts_and_the_q_block_count() -> None:
    declaration = rope_declaration(rows_per_block=8)
    names = ("q", "k", "q_weight", "k_weight", "cos", "sin", "q_out", "k_out")
    pointers = {name: 0x1000 * (i + 1) for i, name in enumerate(names)}
    values = argument_values(declaration, pointers, (12 * 4, 12 * 2), (3, 4, 1))
    # 12 tokens (B 3 x S 4): 4 q rows and 2 k rows a token and their multipliers 2^30 / 4 and / 2, after the extents.
    scalars = [48, 24, 3, 4, 1, 4, 2, 1 << 28, 1 << 29, 6]
    assert values == [*(pointers[n] for n in names[:6]), *scalars, pointers["q_out"], pointers["k_out"]]
    with pytest.raises(ValueError, match="3 extents, got 0"):
        argument_values(declaration, pointers, (48, 24))


@pytest.mark.parametrize(
    ("tokens", "shape"), [(3, (3, 1, 1)), (132, (4, 33, 4)), (4097, (1, 4097, 1)), (32, (4, 8, 4))]
)
def test_rope_cases_get_real_tables_of_their_batch_split_and_shifted_cos(
    tokens: int, shape: tuple[int, int, int]
) -> None:
    """cos/sin [Bc, S, R] of the case's (B, S, Bc) split (`matrix.rope_shape`), values of real angles (|cos| <= 1,
    cos² + sin² = 1 to the dtype), cos one element off alignment where the case shifts it; the extents the
    declaration asks for in its order."""
    entry = rope_entry()
    tensors = CaseTensors(entry, rope_declaration(), LaunchCase(tokens, ("cos",)), device="cpu")
    batch, seq_len, cos_batch = shape
    rotation = tensors.rotation
    assert tensors.extents == shape and (rotation.batch, rotation.seq_len) == (batch, seq_len)
    assert tuple(rotation.cos.shape) == tuple(rotation.sin.shape) == (cos_batch, seq_len, 128)
    unit = rotation.cos.double().square() + rotation.sin.double().square()
    assert bool(((unit - 1).abs() < 2e-2).all())
    pointers = tensors.pointers()
    assert pointers["cos"] % 16 == 2 and pointers["sin"] % 16 == 0
    assert all(part.rotation is rotation for part in tensors.parts.values())
    assert [part.index for part in tensors.parts.values()] == [0, 1]


def test_the_matrix_covers_every_spec_of_the_rope_gpu_tests() -> None:
    """Each rotary GPU test case (spec, heads) is an entry, and its quantized ones too: a failure of the AOT check
    replays in tests/gpu/test_rope_gpu.py."""
    pytest.importorskip("cutlass", reason="tests/gpu/test_rope_gpu.py needs nvidia-cutlass-dsl to import")
    sys.path.insert(0, str(REPO / "tests"))
    import test_rope_gpu as rope_tests

    entries = {(e.spec, e.heads) for e in matrix() if e.kind.name == "qk_norm_rope"}
    cases = {(spec, heads) for _, spec, heads, _ in rope_tests.CASES}
    assert cases <= entries
    named = {name: (spec, heads) for name, spec, heads, _ in rope_tests.CASES}
    for quant in rope_tests.QUANTS:
        for name in ("qwen3", "gemma3-head-major-odd-heads", "olmo2-full-width"):
            spec, heads = named[name]
            assert (dataclasses.replace(spec, quant=quant), heads) in entries


def test_weight_mode_none_gets_a_nan_placeholder_weight() -> None:
    tensors = CaseTensors(rms_entry("bfloat16", None), rms_declaration(64), LaunchCase(3), device="cpu")
    weight = tensors.parts["x"].weight
    assert weight.numel() == 64 and weight.dtype == torch.float32 and bool(torch.isnan(weight).all())


def write_references(entry: MatrixEntry, tensors: CaseTensors) -> None:
    """The float64 reference's outputs (y, with the part's quantizers, and add+norm's h) written into every part's
    output buffers."""
    spec = entry.spec
    for part in tensors.parts.values():
        x, shape = part.x.view(part.rows, part.hidden), (part.rows, part.hidden)
        weight = None if spec.weight_dtype is None else part.weight
        if part.rotation is not None:
            tables = (part.rotation.cos, part.rotation.sin, part.rotation.batch, part.rotation.seq_len)
            y = qk_norm_rope_reference(x, weight, *tables[:2], spec, part.index, *tables[2:])[0]
        elif part.residual is None:
            y = norm_reference(x, weight, spec.params, spec.out_dtype, part.quant)
        else:
            y, h = add_norm_reference(x, part.residual.view(shape), weight, spec.params, spec.out_dtype, part.quant)
            part.h.view(shape).copy_(h)
        part.out.view(shape).copy_(y.reshape(shape))  # as the output holds it (a moving node: [B, H, S, D])


@pytest.mark.parametrize(
    "entry",
    [
        rms_entry(),
        rms_entry("float32", "float32"),
        rms_entry("bfloat16", None),
        qk_entry(),
        add_entry(),
        add_entry("float32", "float16", "float16"),
        add_entry("float16", None, "float32"),
        rope_entry(),
        rope_entry("head_major", "interleaved", 64),
    ],
    ids=repr,
)
def test_outputs_pass_only_when_written_and_close(entry: MatrixEntry) -> None:
    declaration = declaration_for(entry)
    tensors = CaseTensors(entry, declaration, LaunchCase(3, pointer_names(declaration)), device="cpu")
    parts = list(tensors.parts.values())
    assert all(not compare_part(entry.spec, part)[0] for part in parts)  # poisoned: nothing written yet
    write_references(entry, tensors)
    assert all(compare_part(entry.spec, part)[0] for part in parts)
    parts[0].out.view(-1)[5] = float("nan")
    assert compare_part(entry.spec, parts[0])[1].startswith(f"{parts[0].names.out}: 1 NaN")
    write_references(entry, tensors)
    # An absolute step: a relative one can land within the absolute floor when the element is near zero.
    parts[-1].out.view(-1)[7] += 1.0
    passed, detail, _, worst = compare_part(entry.spec, parts[-1])
    assert not passed and "outside" in detail and worst > 1


def quantized_entries() -> list[MatrixEntry]:
    """One matrix entry of each kind per output quantizer dtype and saturate setting (with and without the rsqrt
    stage; of a QK-norm, per part, one with an output quantizer), at a CPU-sized hidden (QK-norm:
    `qk_declaration`'s)."""
    chosen = {}
    for entry in matrix():
        spec = entry.spec
        if spec.quant is None:
            continue
        if entry.heads is not None:
            outputs = [None if q is None else q.output for q in map(spec.part_quant, (0, 1))]
            if outputs == [None, None]:
                continue
            parts = tuple(None if q is None else (q.dtype, q.saturate) for q in outputs)
            # A rotary entry as it is: its hidden sizes are whole heads (and 3 tokens of it are CPU-sized).
            small = (
                entry
                if entry.kind.shared
                else MatrixEntry(dataclasses.replace(spec, q_hidden=128, k_hidden=128), (4, 2))
            )
            chosen.setdefault((entry.kind.name, parts), small)
        elif spec.quant.output is not None:
            key = (entry.kind.name, spec.quant.output.dtype, spec.quant.output.saturate, spec.quant.rsqrt is not None)
            chosen.setdefault(key, MatrixEntry(dataclasses.replace(spec, hidden=64)))
    return list(chosen.values())


def _rotated_magnitude(spec: Spec, part: PartTensors) -> torch.Tensor:
    """|y·c| + |rot(y)·s| of a rotary part, elementwise (`qk_norm_rope_reference`'s magnitude)."""
    rotation, plain = part.rotation, dataclasses.replace(spec, quant=None)
    x = part.x.view(part.rows, part.hidden)
    weight = None if spec.weight_dtype is None else part.weight
    tables = (rotation.cos, rotation.sin)
    return qk_norm_rope_reference(x, weight, *tables, plain, part.index, rotation.batch, rotation.seq_len)[1]


@pytest.mark.parametrize("entry", quantized_entries(), ids=repr)
def test_quantized_outputs_pass_within_one_step_and_only_when_written(entry: MatrixEntry) -> None:
    """The reference's codes pass; a poisoned (unwritten) output, a code two steps off, or a NaN the reference does
    not have, fail: in each quantized part (a QK-norm part left in T is compared as an unquantized y)."""
    spec = entry.spec
    tensors = CaseTensors(entry, declaration_for(entry), LaunchCase(3), device="cpu")
    parts = list(tensors.parts.values())
    assert not any(compare_part(spec, part)[0] for part in parts)
    write_references(entry, tensors)
    for part in parts:
        passed, detail, _, worst = compare_part(spec, part)
        assert passed and worst <= 1, detail
    for part in (p for p in parts if p.quant is not None and p.quant.output is not None):
        flat = part.out.view(-1)
        index = int(flat.float().abs().argmin())  # a small value: two steps up stays in range and finite
        if part.quant.cos_product is not None:
            # Each product may be one step of its grid off (the products' FP8 steps are large where the products
            # are, even where their sum is small): tamper where the rotated terms are smallest.
            index = int(_rotated_magnitude(spec, part).reshape(-1).argmin())
        if part.quant.output.dtype == "int8":
            flat[index] = flat[index] + 3  # three steps: past one step and the tolerance of a small y
        else:
            flat.view(torch.uint8)[index] = (flat.view(torch.uint8)[index] & 0x80) | 0x50  # 8 s: far off a small y
        assert not compare_part(spec, part)[0]
        write_references(entry, tensors)
        if part.quant.output.dtype != "int8":
            flat.view(torch.uint8)[index] = 0x7F
            assert "NaN on one side only" in compare_part(spec, part)[1]
            write_references(entry, tensors)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_add_norm_h_must_be_the_rounded_sum_bit_for_bit(dtype: str) -> None:
    """h passes only as D(x + residual) exactly: one unit in the last place off fails, and so does -0 for the +0
    of an exact cancellation (equal as values), and an unwritten element."""
    entry = add_entry(dtype, "float32", "float32" if dtype != "float32" else None)
    tensors = CaseTensors(entry, add_declaration(64), LaunchCase(3), device="cpu")
    part = tensors.parts["x"]
    x, residual = part.x.view(3, 64), part.residual.view(3, 64)
    x[1, 2], residual[1, 2] = 1.5, -1.5
    write_references(entry, tensors)
    assert compare_part(entry.spec, part)[0]
    as_int = {2: torch.int16, 4: torch.int32}[part.h.element_size()]
    h_bits = part.h.view(as_int)
    h_bits[70] += 1
    assert compare_part(entry.spec, part)[:2] == (False, "h: 1 elements not bit-exact D(x + residual)")
    h_bits[70] -= 1
    assert part.h.view(3, 64)[1, 2].item() == 0.0 and not torch.signbit(part.h.view(3, 64)[1, 2])
    part.h.view(3, 64)[1, 2] = -0.0
    assert not compare_part(entry.spec, part)[0]
    write_references(entry, tensors)
    part.h.view(-1)[0] = float("nan")
    assert compare_part(entry.spec, part)[1] == "h: 1 NaN elements (unwritten or computed)"


def test_a_zero_row_launch_must_leave_the_poisoned_output_untouched() -> None:
    entry = rms_entry()
    tensors = CaseTensors(entry, rms_declaration(64), LaunchCase(0), device="cpu")
    part = tensors.parts["x"]
    assert part.rows == 0 and part.out.numel() == 64
    assert compare_part(entry.spec, part)[0]
    part.out[0] = 1.0
    assert compare_part(entry.spec, part)[:2] == (False, "y: 1 elements written by a 0-row launch")
    add = CaseTensors(add_entry(), add_declaration(64), LaunchCase(0), device="cpu").parts["x"]
    assert add.h.numel() == 64 and compare_part(add_entry().spec, add)[0]
    add.h[3] = 0.0
    assert compare_part(add_entry().spec, add)[:2] == (False, "h: 1 elements written by a 0-row launch")


def test_the_bare_process_guard_blocks_cutlass_and_tvm_ffi() -> None:
    finder = ImportBlocker()
    for name in ("cutlass", "cutlass.cute", "tvm_ffi", "tvm_ffi.core"):
        with pytest.raises(ImportError, match="bare-driver process"):
            finder.find_spec(name, None)
    assert finder.find_spec("numpy", None) is None
    code = "import cutlass; from trtfuse.bench.aot.isolation import require_bare_process; require_bare_process()"
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "has imported cutlass" in done.stderr


def test_the_check_process_imports_no_cutlass_or_tvm_ffi() -> None:
    """What `check` imports before its guard runs: the driver, the launch declarations, the specs, the reference."""
    code = (
        "from trtfuse.bench import reference; from trtfuse.bench.aot import cli, isolation;"
        " import trtfuse.kernels.specs; print(isolation.forbidden_imported())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_check_summary_names_every_failure(capsys: pytest.CaptureFixture[str]) -> None:
    results = [
        CaseResult("000-rms-prefill", "ptx", "tokens=1", True, "", 0.01, 0.4),
        CaseResult("000-rms-prefill", "cubin", "tokens=3 shifted=x", False, "x: 3 NaN elements", float("inf"), 9.0),
    ]
    report = {"gpu": "H200", "arch": "sm_90a", "sms": 132, "artifacts": 1, "cases": 2, "failed": 1, "aborted": ""}
    report |= {"wall_s": 3.0, "seed": 7}
    report |= {"forbidden_modules_imported": [], "results": [dataclasses.asdict(r) for r in results]}
    print_check(report)
    printed = capsys.readouterr().out
    assert "FAIL 000-rms-prefill [cubin] tokens=3 shifted=x: x: 3 NaN elements" in printed
    assert "2 cases, 1 failed; worst passing error 0.40 of the allowed" in printed and "imported: none" in printed


class CpuLaunches:
    """The driver and CUDA replaced on the CPU: every buffer a case allocates is registered by its pointer, and a
    launch packs its arguments as the real one does, then writes the float64 reference through the pointers
    the driver would read. `fault`: "unwritten" leaves the last row of every output NaN; "sum" puts add+norm's h one
    unit in the last place off in one element of the last row (y stays right)."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.tensors: dict[int, torch.Tensor] = {}
        self.spec: object = None
        launches = self

        class Tensors(CaseTensors):
            def __init__(self, entry: MatrixEntry, declaration: LaunchDeclaration, case: LaunchCase) -> None:
                super().__init__(entry, declaration, case, device="cpu")
                for part in self.parts.values():
                    launches.tensors |= {t.data_ptr(): t for t in part.by_name().values()}
                if self.rotation is not None:
                    launches.tensors |= {t.data_ptr(): t for t in (self.rotation.cos, self.rotation.sin)}
                launches.spec = entry.spec

        class Kernel:
            def __init__(self, artifact: object, image: str) -> None:
                self.declaration = artifact.declaration
                self.image = image

            def launch(
                self, pointers: dict[str, int], rows: tuple[int, ...], stream: int, extents: tuple[int, ...] = ()
            ) -> None:
                launches.launch(self.declaration, pointers, rows, extents)

            def unload(self) -> None:
                pass

        class Replay:
            def __init__(
                self, kernel: Kernel, pointers: dict[str, int], rows: tuple[int, ...], extents: tuple[int, ...] = ()
            ) -> None:
                self.replay = lambda: kernel.launch(pointers, rows, 0, extents)

        self.tensors_class, self.kernel_class, self.replay_class = Tensors, Kernel, Replay

    def view(self, pointer: int, rows: int, hidden: int) -> torch.Tensor:
        return self.tensors[pointer].reshape(-1)[: rows * hidden].view(rows, hidden)

    def launch(
        self, declaration: LaunchDeclaration, pointers: dict[str, int], rows: tuple[int, ...], extents: tuple[int, ...]
    ) -> None:
        packed = pack_params(declaration, argument_values(declaration, pointers, rows, extents))
        values = dict(zip([p.name for p in declaration.params], values_the_driver_reads(packed), strict=True))
        spec = self.spec
        parts = zip(part_pointers(spec, declaration), declaration.parts, rows, strict=True)
        for index, ((_, names), part, n) in enumerate(parts):
            if n == 0:
                continue

            def at(name: str, n: int = n, hidden: int = part.hidden) -> torch.Tensor:
                return self.view(values[name], n, hidden)

            weight = None if spec.weight_dtype is None else self.tensors[values[names.weight]]
            outputs = [at(names.out)]
            if "cos" in values:
                # The rotary kernel: the tables by their pointers, B and S from the extents the driver was given.
                tables = (self.tensors[values["cos"]], self.tensors[values["sin"]])
                shapes = (values["batch"], values["seq_len"])
                outputs[0].copy_(qk_norm_rope_reference(at(names.x), weight, *tables, spec, index, *shapes)[0])
            elif names.residual is None:
                outputs[0].copy_(norm_reference(at(names.x), weight, spec.params, spec.out_dtype))
            else:
                y, h = add_norm_reference(at(names.x), at(names.residual), weight, spec.params, spec.out_dtype)
                outputs[0].copy_(y)
                outputs.append(at(names.h).copy_(h))
                if self.fault == "sum":
                    bits = outputs[1].view({2: torch.int16, 4: torch.int32}[h.element_size()])
                    bits[-1, 0] += 1
            if self.fault == "unwritten":
                for output in outputs:
                    output[-1] = float("nan")


@pytest.mark.parametrize("fault", ["none", "unwritten", "sum"])
def test_check_runs_every_case_of_every_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """`check_artifacts` end to end on the CPU (CpuLaunches): manifest, both images, every case, the report."""
    from trtfuse.kernels.declaration import KernelArtifact

    entries = [
        (rms_entry("bfloat16", None), rms_declaration(64)),
        (qk_entry(), qk_declaration()),
        (add_entry("float32", "bfloat16", "bfloat16"), add_declaration(64)),
        (rope_entry("head_major"), rope_declaration()),
    ]
    manifest = {"format": MANIFEST_FORMAT, "arch": "sm_90a", "entries": []}
    for i, (entry, declaration) in enumerate(entries):
        write_artifact(tmp_path, f"e{i}", KernelArtifact(declaration, ".entry k()\n", b"\x7fELF"))
        manifest["entries"].append(manifest_item(entry, {"PREFILL": f"e{i}"}))
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    fakes = CpuLaunches(fault)
    monkeypatch.setattr("trtfuse.bench.aot.check.DriverKernel", fakes.kernel_class)
    monkeypatch.setattr("trtfuse.bench.aot.check.CaseTensors", fakes.tensors_class)
    monkeypatch.setattr("trtfuse.bench.aot.check.captured_launch", fakes.replay_class)
    monkeypatch.setattr("trtfuse.bench.aot.check.bind_torch_context", lambda: None)
    monkeypatch.setattr("trtfuse.bench.aot.check.device_arch_and_sms", lambda: ("sm_90a", 4))
    monkeypatch.setattr("trtfuse.bench.aot.cases.LARGE_ROWS", 40)
    monkeypatch.setattr("trtfuse.bench.aot.cases.RAGGED_ROWS", 17)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("Stream", (), {"cuda_stream": 0})())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")

    report = check_artifacts(tmp_path)
    cases_of = {
        f"e{i}": len(launch_cases(declaration, 4)) + len(NULL_POINTER_CASES)
        for i, (_, declaration) in enumerate(entries)
    }
    assert report["cases"] == 2 * sum(cases_of.values()) and report["artifacts"] == 4
    ran = {(r["artifact"], r["image"]) for r in report["results"]}
    assert ran == {(stem, image) for stem in cases_of for image in ("ptx", "cubin")}
    failed = [r for r in report["results"] if not r["passed"]]
    # Every case but the 0-row launches (2 per image) launches rows, and the fault shows in each of those.
    zero_rows = 2
    if fault == "unwritten":
        cases = {r["case"] for r in failed}
        assert "tokens=0" not in cases and "tokens=3" in cases and "tokens=3 shifted=x,weight,y graph" in cases
        assert report["failed"] == 2 * sum(n - zero_rows for n in cases_of.values())
        add_details = {r["detail"] for r in failed if r["artifact"] == "e2"}
        assert all(d.startswith(("h: 64 NaN", "replay 0: h: 64 NaN")) for d in add_details), add_details
        assert "tokens=3 shifted=residual" in {r["case"] for r in failed if r["artifact"] == "e2"}
    elif fault == "sum":
        assert {r["artifact"] for r in failed} == {"e2"} and len(failed) == 2 * (cases_of["e2"] - zero_rows)
        assert {r["detail"].removeprefix("replay 0: ") for r in failed} == {
            "h: 1 elements not bit-exact D(x + residual)"
        }
    else:
        assert failed == [] and report["failed"] == 0


# --- GPU: compile, then check in a bare-driver process ---------------------------------------------------------------


def run_module(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trtfuse.bench.aot", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    print(done.stdout[-6000:])
    print(done.stderr[-6000:], file=sys.stderr)
    return done


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)")
def test_every_artifact_runs_correctly_from_the_bare_cuda_driver(tmp_path: Path) -> None:
    given = os.environ.get(ARTIFACTS_ENV)
    if given:
        artifacts = Path(given)
    else:
        pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the compile step needs it)")
        artifacts = tmp_path / "artifacts"
        jobs = str(min(8, os.cpu_count() or 1))
        compiled = run_module(["compile", "--out", str(artifacts), "--jobs", jobs], timeout=COMPILE_TIMEOUT_S)
        assert compiled.returncode == 0, compiled.stderr[-3000:]
    report_path = Path(os.environ.get("TRTFUSE_AOT_CHECK_JSON") or tmp_path / "check.json")
    report_path.unlink(missing_ok=True)
    checked = run_module(["check", str(artifacts), "--json", str(report_path)], timeout=CHECK_TIMEOUT_S)
    assert report_path.is_file(), f"check wrote no report (exit {checked.returncode}): {checked.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    failures = [
        f"{r['artifact']} [{r['image']}] {r['case']}: {r['detail']}" for r in report["results"] if not r["passed"]
    ]
    assert report["forbidden_modules_imported"] == []
    assert failures == [], "\n".join(failures[:30])
    assert checked.returncode == 0, checked.stderr[-3000:]
    manifest = json.loads((artifacts / "manifest.json").read_text())
    stems = {stem for entry in manifest["entries"] for stem in entry["stems"].values()}
    ran = {(r["artifact"], r["image"]) for r in report["results"]}
    # PTX whose ISA this driver does not know is not loaded (the report says why); every cubin must run.
    unloadable = set(report["ptx_not_loadable"])
    expected = {(stem, "cubin") for stem in stems} | {(stem, "ptx") for stem in stems - unloadable}
    assert ran == expected
    assert len(manifest["entries"]) == len(matrix())


# --- CPU: the side-by-side benchmark's bookkeeping -------------------------------------------------------------------


def test_the_benchmark_times_today_twice_around_every_tactic_and_keeps_the_faster() -> None:
    pytest.importorskip("cutlass", reason="the AOT benchmark compiles artifacts with nvidia-cutlass-dsl")
    from trtfuse.bench.aot import benchmark

    timings = {"today": [10.0, 10.5], "prefill": [12.0], "decode": [9.0]}
    order: list[str] = []

    def call(name: str) -> benchmark.Call:
        return lambda i: order.append(name)

    def time_one(c: benchmark.Call) -> float:
        c(0)
        return timings[order[-1]].pop(0)

    events: list[str] = []
    row = benchmark.timed_side_by_side(
        call("today"),
        {Tactic.PREFILL: call("prefill"), Tactic.DECODE: call("decode")},
        time_one,
        lambda: events.append("poison"),
        lambda what: events.append(f"verify {what}"),
    )
    assert order == ["today", "prefill", "decode", "today"]
    assert events[:2] == ["poison", "verify today_us"] and len(events) == 8
    assert row["faster_tactic"] == "decode" and row["today_spread_pct"] == pytest.approx(5.0)
    row = benchmark.finish(row | {"timing": "graph", "shape": "8x4096"}, Tactic.DECODE)
    assert row["aot_over_today"] == pytest.approx(9.0 / 10.25) and row["expected_tactic"] == "decode"
    benchmark.add_pct_copy(row, nbytes=4_000_000, copy_gbs=4000.0)
    assert row["aot_decode_pct_copy"] == pytest.approx(100 * 4_000_000 / 9.0 / 1e3 / 4000.0)
    assert "aot decode     9.00*" in benchmark._line("rms 8x4096", row)


def test_the_benchmark_expects_decode_up_to_one_row_per_sm() -> None:
    pytest.importorskip("cutlass", reason="the AOT benchmark compiles artifacts with nvidia-cutlass-dsl")
    from trtfuse.bench.aot.benchmark import expected_tactic

    both = (Tactic.PREFILL, Tactic.DECODE)
    assert expected_tactic(1, 132, both) is Tactic.DECODE
    assert expected_tactic(132, 132, both) is Tactic.DECODE
    assert expected_tactic(133, 132, both) is Tactic.PREFILL
    assert expected_tactic(1, 132, (Tactic.PREFILL,)) is Tactic.PREFILL


def test_the_benchmark_times_the_cubins_in_one_line_where_the_driver_refuses_the_ptx(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trtfuse.bench.aot import benchmark

    monkeypatch.setattr(benchmark, "_NOTED", [])
    monkeypatch.setattr(benchmark, "driver_version", lambda: 12080)
    ptx = ".version 9.0\n.target sm_90a\n"
    assert benchmark.loadable_image(ptx) == "cubin"
    assert benchmark.loadable_image(ptx) == "cubin"
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: the kernels' PTX is ISA 9.0") and "cubins" in lines[0]
    monkeypatch.setattr(benchmark, "driver_version", lambda: 13000)
    assert benchmark.loadable_image(ptx) == "ptx"
