"""CPU/CI: every AOT artifact compiles for every target architecture, and its PTX agrees with its declaration."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.bench.aot.compile import compile_matrix
from trtfuse.bench.aot.manifest import manifest_entries, read_artifact
from trtfuse.bench.aot.matrix import matrix
from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels import artifacts
from trtfuse.kernels.api import rms_norm_tiling
from trtfuse.kernels.artifacts import (
    AOT_ARCHS,
    aot_archs,
    qk_norm_artifact,
    rms_norm_artifact,
    rms_norm_tactics,
)
from trtfuse.kernels.compiler import RmsNormVariant
from trtfuse.kernels.declaration import Tactic
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec, has_fp8_stage
from trtfuse.kernels.tiling import Regime

from support.aot_ptx import check_artifact, entry_params, global_accesses

AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
QWEN3_QK = QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
# Each kernel kind's parameters, in TensorRT's order (inputs, scalars, outputs), as the PTX entry must take them.
KIND_PARAMS = {
    "rms_norm": ["x", "weight", "rows", "y"],
    "add_rms_norm": ["x", "residual", "weight", "rows", "y", "h"],
    "qk_norm": ["q", "k", "q_weight", "k_weight", "q_rows", "k_rows", "q_blocks", "q_out", "k_out"],
    "qk_norm_rope": [
        *("q", "k", "q_weight", "k_weight", "cos", "sin"),
        *("q_rows", "k_rows", "batch", "seq_len", "cos_batch", "q_rows_per_token", "k_rows_per_token"),
        *("q_token_magic", "k_token_magic", "q_blocks", "q_out", "k_out"),
    ],
}


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("aot-cache")


@pytest.mark.parametrize("arch", AOT_ARCHS)
def test_every_artifact_compiles_for_every_architecture(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matrix the H200 check runs (every spec of the kernel GPU tests: dtype pairs, weight modes, hidden sizes,
    QK shapes; add+norm's dtype pairs, weight modes and hidden sizes; every tactic), compiled for each target and
    read back as the bare-driver check reads it."""
    monkeypatch.setenv("TRTFUSE_KERNEL_CACHE", str(tmp_path / "cache"))
    manifest = compile_matrix(tmp_path / "artifacts", arch, jobs=2)
    names = set()
    per_kind: Counter[str] = Counter()
    for entry, stems in manifest_entries(manifest):
        for tactic_name, stem in stems.items():
            artifact = read_artifact(tmp_path / "artifacts", stem)
            check_artifact(artifact, arch)
            assert artifact.declaration.tactic is Tactic[tactic_name]
            assert [p.name for p in artifact.declaration.params] == KIND_PARAMS[entry.kind.name]
            names.add(artifact.declaration.kernel_name)
            per_kind[entry.kind.name] += 1
    assert len(names) == sum(len(stems) for _, stems in manifest_entries(manifest)), "shared entry names"
    # A floor per kind, so a matrix that lost its entries of one kind fails here too.
    assert set(per_kind) == set(KIND_PARAMS)
    assert per_kind["rms_norm"] + per_kind["qk_norm"] >= 150 and per_kind["add_rms_norm"] >= 30
    assert per_kind["qk_norm_rope"] >= 11
    # Every quantized entry where the arch runs its quantizers: FP8 from sm_89, INT8 everywhere.
    quantized = [e.spec for e, _ in manifest_entries(manifest) if getattr(e.spec, "quant", None) is not None]
    expected = [e.spec for e in matrix() if getattr(e.spec, "quant", None) is not None and arch in aot_archs(e.spec)]
    assert quantized == expected and any(has_fp8_stage(s) for s in quantized) == (arch not in ("sm_80", "sm_86"))


def test_vector_kernels_keep_an_in_kernel_scalar_path(cache_root: Path) -> None:
    """The AOT kernel promises only element alignment and branches on the pointers itself: both paths are in the
    PTX, and the address test survives (an align-16 promise would fold it away)."""
    spec = RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    for tactic in rms_norm_tactics(spec):
        ptx = rms_norm_artifact(spec, tactic, "sm_90a", cache_root).ptx
        assert ".align 16" not in entry_params(ptx)[1][0]
        accesses = global_accesses(ptx)
        assert any(a.endswith(".v4.b32") for a in accesses if a.startswith("ld."))
        assert {"ld.global.b16", "st.global.b16"} <= accesses
        assert re.search(r"and\.b64\s+%rd\d+, %rd\d+, 14;", ptx)
    prefill = rms_norm_artifact(spec, Tactic.PREFILL, "sm_90a", cache_root).ptx
    assert any(".L2::cache_hint" in a for a in global_accesses(prefill)), "the prefill tiling reads x twice"


def test_a_row_no_vector_divides_has_only_the_scalar_path(cache_root: Path) -> None:
    spec = RmsNormSpec(1001, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    ptx = rms_norm_artifact(spec, Tactic.PREFILL, "sm_90a", cache_root).ptx
    assert not any(".v4" in a for a in global_accesses(ptx))


def test_head_dim_rows_offer_one_tactic_and_wide_rows_two() -> None:
    head = RmsNormSpec(128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    wide = RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    assert rms_norm_tactics(head) == (Tactic.PREFILL,)
    assert rms_norm_tactics(wide) == (Tactic.PREFILL, Tactic.DECODE)
    with pytest.raises(ValueError, match="tactic"):
        rms_norm_artifact(head, Tactic.DECODE, "sm_90a")


def test_variants_differing_only_in_epsilon_get_distinct_entries(cache_root: Path) -> None:
    a, b = (RmsNormSpec(2048, "float16", "float16", NormParams(eps, 0.0, AFTER)) for eps in (1e-5, 1e-6))
    first, second = (rms_norm_artifact(s, Tactic.PREFILL, "sm_90a", cache_root) for s in (a, b))
    assert first.declaration.kernel_name != second.declaration.kernel_name
    assert first.ptx != second.ptx


def test_entry_names_are_short_and_a_claimed_prefix_is_never_shared(tmp_path: Path) -> None:
    """An artifact keeps the prefix it claimed; another key whose digits collide with it gets a salted one."""
    first = artifacts.claim_entry_prefix(tmp_path, "0123456789abcdef01234567")
    assert first == "tf0123456789a" and len(first) + len("_0") == artifacts.ENTRY_NAME_MAX
    assert artifacts.claim_entry_prefix(tmp_path, "0123456789abcdef01234567") == first
    colliding = artifacts.claim_entry_prefix(tmp_path, "0123456789affffffffffff")
    assert colliding != first and len(colliding) == len(first) and colliding.startswith("tf")
    assert artifacts.claim_entry_prefix(tmp_path, "0123456789affffffffffff") == colliding
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"entry-{first}", f"entry-{colliding}"])


def test_a_compiled_artifact_takes_the_salted_name_when_its_digits_are_taken(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RmsNormSpec(512, "float16", "float16", NormParams(3e-5, 0.0, AFTER))
    variant = RmsNormVariant(spec, rms_norm_tiling(spec, Regime.PREFILL, aligned=True), "sm_90a")
    variant_key = artifacts.artifact_key(variant)
    folder = artifacts.cache_folder(cache_root, "sm_90a")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"entry-tf{variant_key[:11]}").write_text("another artifact's key")
    monkeypatch.setattr(artifacts, "_memory", {})
    artifact = rms_norm_artifact(spec, Tactic.PREFILL, "sm_90a", cache_root)
    name = artifact.declaration.kernel_name
    assert name != f"tf{variant_key[:11]}_0" and len(name) == 15
    check_artifact(artifact, "sm_90a")


@pytest.mark.parametrize("rows", [0, 1, 7, 132, 133, 16384])
def test_the_grid_covers_every_row_once(rows: int, cache_root: Path) -> None:
    """Evaluated over a profile's range (1 row, an SM count, long prefill): every row lands in exactly one block of
    its part, the grid is never empty, and the q block count scalar is where the k blocks start."""
    for tactic in (Tactic.PREFILL, Tactic.DECODE):
        spec = RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
        declaration = rms_norm_artifact(spec, tactic, "sm_90a", cache_root).declaration
        (part,) = declaration.parts
        grid = declaration.grid_x([rows])
        assert grid >= 1
        assert grid * part.rows_per_block >= rows > (grid - 1) * part.rows_per_block or grid == 1 == rows + 1
        assert declaration.scalars([rows]) == (rows,)
    qk = qk_norm_artifact(QWEN3_QK, Tactic.PREFILL, "sm_90a", cache_root).declaration
    q_rows, k_rows = rows * 32, rows * 8
    q_part, k_part = qk.parts
    q_blocks = -(-q_rows // q_part.rows_per_block)
    assert qk.scalars([q_rows, k_rows]) == (q_rows, k_rows, q_blocks)
    assert qk.grid_x([q_rows, k_rows]) == max(1, q_blocks + -(-k_rows // k_part.rows_per_block))
    assert qk.rows_of([q_rows * 128, k_rows * 128]) == (q_rows, k_rows)


def test_artifacts_are_read_back_from_disk_without_compiling(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RmsNormSpec(5120, "float16", "float32", NormParams(1e-6, 1.0, BEFORE))
    compiled = rms_norm_artifact(spec, Tactic.DECODE, "sm_89", cache_root)
    monkeypatch.setattr(artifacts, "_memory", {})

    def refuse(*args: object) -> None:
        raise AssertionError("compiled again instead of reading the cache")

    monkeypatch.setattr(artifacts, "compile_aot_variant", refuse)
    assert rms_norm_artifact(spec, Tactic.DECODE, "sm_89", cache_root) == compiled
    assert len(list(cache_root.rglob("aot-*.json"))) >= 1
    assert not list(cache_root.rglob("tmp*")), "a temporary file was left in the cache"


@pytest.mark.parametrize(
    ("isa", "driver", "problem"),
    [
        ("8.8", 12090, None),
        ("8.8", 13000, None),
        ("9.1", 13000, "ISA 9.1, which needs a CUDA 13.1 driver; this machine's driver is CUDA 13.0"),
        ("8.8", 12080, "ISA 8.8, which needs a CUDA 12.9 driver; this machine's driver is CUDA 12.8"),
        ("9.9", 13000, None),  # newer than cuda-bindings' table: the driver judges
        ("9.9", None, None),  # no driver here: nothing to refuse
    ],
)
def test_ptx_a_driver_cannot_jit_is_named_with_both_versions(isa: str, driver: int | None, problem: str | None) -> None:
    """The H200's driver (CUDA 13.0) refused CuTeDSL-cu13's PTX with CUDA_ERROR_UNSUPPORTED_PTX_VERSION; the build
    must say so instead of letting TensorRT fail to time the kernel."""
    from trtfuse.kernels.device import ptx_driver_problem

    found = ptx_driver_problem(f".version {isa}\n.target sm_90a\n", driver)
    assert (found is None) == (problem is None)
    if problem is not None:
        assert problem in found


@pytest.mark.parametrize(
    ("accepts", "problem"),
    [(False, "9.9, which this machine's CUDA 13.0 driver does not accept"), (True, None), (None, None)],
)
def test_an_isa_the_table_does_not_know_is_put_to_the_driver(
    monkeypatch: pytest.MonkeyPatch, accepts: bool | None, problem: str | None
) -> None:
    """The H200's cuda-bindings (13.3.1) had no entry for CuTeDSL-cu13's ISA 9.4, which its driver refused: the
    driver itself is asked (an empty kernel of that ISA and target), and only a refusal stops the build."""
    from trtfuse.kernels import device

    asked = []
    monkeypatch.setattr(device, "driver_accepts_isa", lambda isa, target: asked.append((isa, target)) or accepts)
    found = device.ptx_driver_problem(".version 9.9\n.target sm_90a\n", 13000)
    assert asked == [("9.9", "sm_90a")]
    assert found == problem or (problem is not None and problem in found)
