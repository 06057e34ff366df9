"""CPU/CI: the AOT add+norm artifacts compile for every target architecture and agree with their declarations."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.contract import ACTIVATION_DTYPES, NormParams, WeightMode, dtype_pair_problem
from trtfuse.kernels.artifacts import AOT_ARCHS, ENTRY_NAME_MAX, add_rms_norm_artifact, add_rms_norm_tactics
from trtfuse.kernels.declaration import KernelArtifact, LaunchDeclaration, ParamRole, Tactic
from trtfuse.kernels.specs import AddRmsNormSpec

from support.aot_ptx import entry_params, global_accesses

AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
ADD_PARAMS = ["x", "residual", "weight", "rows", "y", "h"]
PAIRS = [(d, t) for d, t in itertools.product(ACTIVATION_DTYPES, repeat=2) if dtype_pair_problem(d, t) is None]
MATRIX = [
    # Every (D, T) pair with a weight of the 16-bit side (fp32 for fp32 rows), Gemma's mode on the one-dtype ones.
    AddRmsNormSpec(4096, d, t if d == "float32" else d, NormParams(1e-6, 1.0 if d == t else 0.0, mode), t)
    for (d, t), mode in zip(PAIRS, itertools.cycle((AFTER, BEFORE)))
] + [
    AddRmsNormSpec(4096, "bfloat16", None, NormParams(1e-5, 0.0, NONE)),
    AddRmsNormSpec(8192, "float16", "float32", NormParams(1e-6, 0.0, AFTER)),
    AddRmsNormSpec(1001, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),  # no vector divides the row
    AddRmsNormSpec(128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),  # one warp of vectors: one tactic
]


def check_artifact(artifact: KernelArtifact, arch: str) -> None:
    """One entry whose name and parameters are the declaration's (pointers `.u64 .ptr .global`, the row count
    `.u32`, TensorRT's order: inputs, scalars, outputs), for `arch`, a name of at most 15 characters (docs/aot.md),
    the block as `.reqntid`, and a cubin holding the entry; the declaration round-trips through JSON."""
    declaration = artifact.declaration
    assert declaration.arch == arch and re.search(rf"^\.target {arch}\b", artifact.ptx, re.M)
    name, params = entry_params(artifact.ptx)
    assert name == declaration.kernel_name and len(name) <= ENTRY_NAME_MAX == 15
    assert len(params) == len(declaration.params)
    for index, (text, param) in enumerate(zip(params, declaration.params, strict=True)):
        assert text.startswith(f".param {param.ptx_type}") and text.endswith(f"{name}_param_{index}"), (text, param)
        assert (".ptr .global" in text) == (param.role is not ParamRole.SCALAR)
    roles = [p.role for p in declaration.params]
    assert roles == sorted(roles, key=[ParamRole.INPUT, ParamRole.SCALAR, ParamRole.OUTPUT].index)
    assert re.search(rf"\.reqntid {declaration.block_threads}, 1, 1", artifact.ptx)
    assert artifact.cubin[:4] == b"\x7fELF" and name.encode() in artifact.cubin
    assert LaunchDeclaration.from_json(json.loads(declaration.dumps())) == declaration


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("add-norm-aot-cache")


@pytest.mark.parametrize("arch", AOT_ARCHS)
def test_every_add_norm_artifact_compiles_for_every_architecture(arch: str, cache_root: Path) -> None:
    """Each spec of the matrix in each of its tactics: one `.entry` whose parameters are the declaration's, in
    TensorRT's order (x, residual, weight, rows, y, h), with a cubin for `arch`; no two share an entry name."""
    names = set()
    for spec in MATRIX:
        for tactic in add_rms_norm_tactics(spec):
            artifact = add_rms_norm_artifact(spec, tactic, arch, cache_root)
            check_artifact(artifact, arch)
            assert artifact.declaration.tactic is tactic
            assert [p.name for p in artifact.declaration.params] == ADD_PARAMS
            names.add(artifact.declaration.kernel_name)
    assert len(names) == sum(len(add_rms_norm_tactics(s)) for s in MATRIX), "shared entry names"


def test_vector_kernels_test_every_pointer_and_keep_the_element_path(cache_root: Path) -> None:
    """The AOT kernel is promised element alignment only: both paths are in the PTX and the address test on the
    five pointers survives."""
    spec = AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    for tactic in add_rms_norm_tactics(spec):
        ptx = add_rms_norm_artifact(spec, tactic, "sm_90a", cache_root).ptx
        assert not any(".align 16" in p for p in entry_params(ptx)[1])
        accesses = global_accesses(ptx)
        assert {"ld.global.v4.b32", "st.global.v4.b32", "ld.global.b16", "st.global.b16"} <= accesses
        assert re.search(r"and\.b64\s+%rd\d+, %rd\d+, 14;", ptx)
        # All five pointers are read (the row count is the one 32-bit parameter, 3).
        assert set(re.findall(r"ld\.param\.b64\s+%rd\d+, \[\w+_param_(\d)\]", ptx)) == set("01245")


def test_a_row_no_vector_divides_has_only_the_element_path(cache_root: Path) -> None:
    spec = AddRmsNormSpec(1001, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    ptx = add_rms_norm_artifact(spec, Tactic.PREFILL, "sm_90a", cache_root).ptx
    assert not any(".v4" in a for a in global_accesses(ptx))


def test_tactics_and_the_grid(cache_root: Path) -> None:
    """Head-dim rows offer one tactic, wide rows two; over a profile's range every row lands in exactly one block
    and the only scalar is the row count."""
    head = AddRmsNormSpec(128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    wide = AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    assert add_rms_norm_tactics(head) == (Tactic.PREFILL,)
    assert add_rms_norm_tactics(wide) == (Tactic.PREFILL, Tactic.DECODE)
    with pytest.raises(ValueError, match="tactic"):
        add_rms_norm_artifact(head, Tactic.DECODE, "sm_90a", cache_root)
    for tactic in add_rms_norm_tactics(wide):
        declaration = add_rms_norm_artifact(wide, tactic, "sm_90a", cache_root).declaration
        (part,) = declaration.parts
        assert part.name == "x" and part.hidden == 4096
        for rows in (0, 1, 7, 132, 133, 16384):
            grid = declaration.grid_x([rows])
            assert grid >= 1 and declaration.scalars([rows]) == (rows,)
            assert grid * part.rows_per_block >= rows > (grid - 1) * part.rows_per_block or grid == 1 == rows + 1
