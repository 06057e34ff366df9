"""Ahead-of-time kernel artifacts: PTX and cubin of a spec's tiling for one architecture, with its launch declaration.

TensorRT's AOT plugins embed the PTX in the engine and launch the kernel themselves, with the grid, block and scalar
arguments the declaration gives as functions of the row counts. Each tactic is one tiling (`Tactic`), chosen by
TensorRT's timing per optimisation profile instead of per call. Artifacts are cached on disk beside the compiled
kernels (same folder, so the same version, CuTeDSL and kernel-source keys), and in memory per process.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

from trtfuse.kernels.api import QkNormRopeKernel, qk_norm_tilings, rms_norm_tiling
from trtfuse.kernels.cache import cache_folder, default_cache_root, write_cache_file
from trtfuse.kernels.compiler import (
    AddRmsNormVariant,
    QkNormRopeVariant,
    QkNormVariant,
    RmsNormVariant,
    Variant,
    compile_aot_variant,
)
from trtfuse.kernels.declaration import (
    ROPE_EXTENTS,
    Extent,
    KernelArtifact,
    KernelParam,
    LaunchDeclaration,
    RowPart,
    Tactic,
    add_rms_norm_params,
    qk_norm_params,
    qk_norm_rope_params,
    rms_norm_params,
)
from trtfuse.kernels.device import FP8_MIN_SM, arch_sm, current_device
from trtfuse.kernels.norm_kernel import smem_bytes
from trtfuse.kernels.specs import AddRmsNormSpec, QkNormRopeSpec, QkNormSpec, RmsNormSpec, has_fp8_stage
from trtfuse.kernels.tiling import GpuTable, Regime, gpu_table

# The targets CI compiles every artifact for: Ampere (A100, A10/RTX 30, L4/RTX 40), Hopper and Blackwell datacenter.
AOT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
_REGIMES = {Tactic.PREFILL: Regime.PREFILL, Tactic.DECODE: Regime.DECODE}

# Entry names fit libstdc++'s 15-character inline string buffer: TensorRT 10.10-10.13's Python binding hands TensorRT
# the name through a std::string destroyed before TensorRT reads it (docs/aot.md), and an inline name is the one kind
# that survives such a regression. "tf", 11 hex digits of the artifact key, then CuTeDSL's "_0".
ENTRY_NAME_MAX = 15
_ENTRY_HEX = 11
_ENTRY_SALTS = 64

_memory: dict[tuple[Path, str], KernelArtifact] = {}
# One compilation at a time: the entry name is set on the shared kernel function before each compile.
_compile_lock = threading.Lock()


def aot_archs(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> tuple[str, ...]:
    """The AOT_ARCHS `spec` compiles for: every one, less those before sm_89 for an FP8 quantizer (its conversions
    need sm_89; TensorRT runs FP8 on none of them either)."""
    if not has_fp8_stage(spec):
        return AOT_ARCHS
    return tuple(arch for arch in AOT_ARCHS if arch_sm(arch) >= FP8_MIN_SM)


def table_for_arch(arch: str) -> GpuTable:
    """The tiling table of an artifact for `arch`: the GPU in this machine's when it is of that architecture (the
    engine is built on the GPU it runs on), else the default (`tiling.gpu_table`)."""
    device = current_device()
    return gpu_table(device.name if device.has_gpu and device.arch == arch else "")


def rms_norm_tactics(spec: RmsNormSpec | AddRmsNormSpec) -> tuple[Tactic, ...]:
    """Prefill and decode, or prefill alone where the two tilings are one (rows of at most one warp of vectors)."""
    prefill, decode = (rms_norm_tiling(spec, regime, aligned=True) for regime in (Regime.PREFILL, Regime.DECODE))
    return (Tactic.PREFILL,) if prefill == decode else (Tactic.PREFILL, Tactic.DECODE)


def add_rms_norm_tactics(spec: AddRmsNormSpec) -> tuple[Tactic, ...]:
    """RMSNorm's rule on the add+norm tilings."""
    return rms_norm_tactics(spec)


def qk_norm_tactics(spec: QkNormSpec) -> tuple[Tactic, ...]:
    """One tiling whatever the row count (`api.qk_norm_tilings`)."""
    del spec
    return (Tactic.PREFILL,)


def _check_tactic(tactic: Tactic, offered: tuple[Tactic, ...], spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> None:
    if tactic not in offered:
        raise ValueError(f"tactic {tactic!r} is not one of {offered} for {spec}")


def rms_norm_artifact(spec: RmsNormSpec, tactic: Tactic, arch: str, cache_root: Path | None = None) -> KernelArtifact:
    """The AOT kernel of `spec` in `tactic`'s tiling for `arch` (CuTeDSL's --gpu-arch, e.g. "sm_90a")."""
    return _rows_artifact(RmsNormVariant, rms_norm_params(), spec, tactic, arch, cache_root)


def add_rms_norm_artifact(
    spec: AddRmsNormSpec, tactic: Tactic, arch: str, cache_root: Path | None = None
) -> KernelArtifact:
    """The AOT add+norm kernel of `spec` in `tactic`'s tiling for `arch`: RMSNorm's grid, two more pointers."""
    return _rows_artifact(AddRmsNormVariant, add_rms_norm_params(), spec, tactic, arch, cache_root)


def _rows_artifact(
    variant_type: type[RmsNormVariant | AddRmsNormVariant],
    params: tuple[KernelParam, ...],
    spec: RmsNormSpec | AddRmsNormSpec,
    tactic: Tactic,
    arch: str,
    cache_root: Path | None,
) -> KernelArtifact:
    """An RMSNorm-grid kernel's artifact: one part, the rows of x."""
    tactic = Tactic(tactic)
    _check_tactic(tactic, rms_norm_tactics(spec), spec)
    tiling = rms_norm_tiling(spec, _REGIMES[tactic], aligned=True, table=table_for_arch(arch))
    parts = (RowPart("x", spec.hidden, tiling.rows_per_block),)
    variant = variant_type(spec, tiling, arch)
    return _artifact(variant, tactic, params, parts, tiling.block_threads, smem_bytes(tiling), cache_root)


def qk_norm_artifact(spec: QkNormSpec, tactic: Tactic, arch: str, cache_root: Path | None = None) -> KernelArtifact:
    """The AOT QK-norm kernel of `spec` for `arch`: q blocks first, then k blocks, in one grid."""
    tactic = Tactic(tactic)
    _check_tactic(tactic, qk_norm_tactics(spec), spec)
    q_tiling, k_tiling = qk_norm_tilings(spec, aligned=True)
    return _qk_artifact(QkNormVariant(spec, q_tiling, k_tiling, arch), tactic, qk_norm_params(), (), cache_root)


def qk_norm_rope_tactics(spec: QkNormRopeSpec) -> tuple[Tactic, ...]:
    """QK-norm's one tiling."""
    return qk_norm_tactics(spec)


def qk_norm_rope_artifact(
    spec: QkNormRopeSpec, tactic: Tactic, arch: str, cache_root: Path | None = None
) -> KernelArtifact:
    """The AOT QK-norm + rotary kernel of `spec` for `arch` (the JIT's one kernel): QK-norm's grid, cos and sin
    after the weights, and the batch, sequence length and cos batch read off q's and cos's shapes (`ROPE_EXTENTS`)
    after the row counts."""
    tactic = Tactic(tactic)
    _check_tactic(tactic, qk_norm_rope_tactics(spec), spec)
    variant = QkNormRopeKernel.variant_for(spec, arch)
    return _qk_artifact(variant, tactic, qk_norm_rope_params(), ROPE_EXTENTS, cache_root)


def _qk_artifact(
    variant: QkNormVariant | QkNormRopeVariant,
    tactic: Tactic,
    params: tuple[KernelParam, ...],
    extents: tuple[Extent, ...],
    cache_root: Path | None,
) -> KernelArtifact:
    """A QK-norm-grid kernel's artifact: two parts, q's rows then k's."""
    spec, q_tiling, k_tiling = variant.spec, variant.q_tiling, variant.k_tiling
    parts = (
        RowPart("q", spec.q_hidden, q_tiling.rows_per_block),
        RowPart("k", spec.k_hidden, k_tiling.rows_per_block),
    )
    shared = smem_bytes(q_tiling) + smem_bytes(k_tiling)
    return _artifact(variant, tactic, params, parts, q_tiling.block_threads, shared, cache_root, extents)


def artifact_key(variant: Variant) -> str:
    """A digest of everything that shapes the AOT machine code: the artifact's file name in the cache."""
    return hashlib.sha256(repr(("aot", variant)).encode()).hexdigest()[:24]


def claim_entry_prefix(folder: Path, key: str) -> str:
    """The entry-name prefix of artifact `key`, unique among the artifacts of `folder` (one cache folder per
    architecture: what one build embeds). 11 hex digits of the key, or of a salted digest where another key already
    claimed those; the claim is a file named after the prefix holding the key, made exclusively."""
    folder.mkdir(parents=True, exist_ok=True)
    for salt in range(_ENTRY_SALTS):
        digest = key if salt == 0 else hashlib.sha256(f"{key}/{salt}".encode()).hexdigest()
        prefix = f"tf{digest[:_ENTRY_HEX]}"
        claim = folder / f"entry-{prefix}"
        fd, tmp = tempfile.mkstemp(prefix=".entry-", dir=folder)
        try:
            os.write(fd, key.encode())
            os.close(fd)
            try:
                os.link(tmp, claim)
                return prefix
            except FileExistsError:
                if claim.read_text() == key:
                    return prefix
        finally:
            os.unlink(tmp)
    raise RuntimeError(f"no free entry name for AOT artifact {key} in {folder} after {_ENTRY_SALTS} digests")


def _artifact(
    variant: Variant,
    tactic: Tactic,
    params: tuple,
    parts: tuple[RowPart, ...],
    block_threads: int,
    shared_mem: int,
    cache_root: Path | None,
    extents: tuple[Extent, ...] = (),
) -> KernelArtifact:
    root = cache_root if cache_root is not None else default_cache_root()
    key = artifact_key(variant)
    folder = cache_folder(root, variant.arch)
    artifact = _memory.get((folder, key))
    if artifact is not None:
        return artifact
    with _compile_lock:
        artifact = _memory.get((folder, key)) or _read(folder, key)
        if artifact is None:
            with tempfile.TemporaryDirectory(prefix="trtfuse-aot-") as dump:
                compiled = compile_aot_variant(variant, claim_entry_prefix(folder, key), Path(dump))
            if len(compiled.kernel_name) > ENTRY_NAME_MAX:
                raise RuntimeError(f"AOT entry name {compiled.kernel_name} is over {ENTRY_NAME_MAX} characters")
            declaration = LaunchDeclaration(
                kernel_name=compiled.kernel_name,
                arch=variant.arch,
                tactic=tactic,
                block_threads=block_threads,
                shared_mem=shared_mem,
                params=params,
                parts=parts,
                extents=extents,
            )
            artifact = KernelArtifact(declaration, compiled.ptx, compiled.cubin)
            _write(folder, key, artifact)
        _memory[(folder, key)] = artifact
    return artifact


def _paths(folder: Path, key: str) -> tuple[Path, Path, Path]:
    stem = folder / f"aot-{key}"
    return stem.with_suffix(".ptx"), stem.with_suffix(".cubin"), stem.with_suffix(".json")


def _write(folder: Path, key: str, artifact: KernelArtifact) -> None:
    ptx, cubin, declaration = _paths(folder, key)
    write_cache_file(ptx, lambda tmp: tmp.write_text(artifact.ptx))
    write_cache_file(cubin, lambda tmp: tmp.write_bytes(artifact.cubin))
    # The declaration last: its presence says the entry is complete.
    write_cache_file(declaration, lambda tmp: tmp.write_text(artifact.declaration.dumps()))


def _read(folder: Path, key: str) -> KernelArtifact | None:
    ptx, cubin, declaration = _paths(folder, key)
    if not declaration.exists():
        return None
    loaded = LaunchDeclaration.from_json(json.loads(declaration.read_text()))
    return KernelArtifact(loaded, ptx.read_text(), cubin.read_bytes())
