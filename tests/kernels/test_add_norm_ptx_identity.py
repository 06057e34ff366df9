"""CPU/CI: the one-input RMSNorm and QK-norm kernels compile to the PTX they compiled to before the residual flag.

The add+norm kernel shares their device code (`norm_kernel._normalize_block_rows` with a residual), so this pins
today's variants byte for byte: `tests/kernels/test_add_norm_ptx_hashes.json` holds the SHA-256 of each variant's PTX as
compiled at 7b37a28, recorded by running this file as a script against that commit's package:

    git archive 7b37a28 | tar -x -C /tmp/base
    CUTE_DSL_ARCH=sm_90a PYTHONPATH=/tmp/base python3 tests/kernels/test_add_norm_ptx_identity.py --record OUT.json

The PTX depends on the compiler too, so the test runs only where CuTeDSL's version and its PTX header (the CUDA
release it writes for) are the recorded ones.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

HASHES = Path(__file__).with_name("test_add_norm_ptx_hashes.json")
ARCH = "sm_90a"


def _cases() -> dict[str, Callable[[Path], str]]:
    """name -> compile(scratch folder) -> PTX text, for a spread of today's variants: every dtype pair and weight
    mode, both regimes, multi-warp, ragged, scalar and head-dim rows, QK-norm, and the AOT entries."""
    from trtfuse.contract import NormParams, WeightMode
    from trtfuse.kernels.api import QkNormKernel, RmsNormKernel
    from trtfuse.kernels.artifacts import qk_norm_artifact, rms_norm_artifact
    from trtfuse.kernels.cache import KernelCache
    from trtfuse.kernels.compiler import compile_variant
    from trtfuse.kernels.declaration import Tactic
    from trtfuse.kernels.device import DeviceInfo
    from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec
    from trtfuse.kernels.tiling import Regime

    hopper = DeviceInfo(arch=ARCH, sm_count=132, has_gpu=False)
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    llama = NormParams(1e-6, 0.0, after)
    gemma = NormParams(1e-6, 1.0, before)
    plain = NormParams(1e-5, 0.0, none)
    rms = {
        "bf16-4096-llama": RmsNormSpec(4096, "bfloat16", "bfloat16", llama),
        "fp16-4096-gemma-fp32w": RmsNormSpec(4096, "float16", "float32", gemma),
        "fp32-2048-llama-bf16w": RmsNormSpec(2048, "float32", "bfloat16", llama),
        "bf16-8192-none": RmsNormSpec(8192, "bfloat16", None, plain),
        "fp16-5120-llama": RmsNormSpec(5120, "float16", "float16", llama),
        "fp16-1001-llama": RmsNormSpec(1001, "float16", "float16", llama),
        "bf16-128-llama": RmsNormSpec(128, "bfloat16", "bfloat16", llama),
        "fp32-to-bf16-4096-llama": RmsNormSpec(4096, "float32", "bfloat16", llama, "bfloat16"),
        "bf16-to-fp32-4096-gemma": RmsNormSpec(4096, "bfloat16", "float32", gemma, "float32"),
        "fp16-to-fp32-1000-none": RmsNormSpec(1000, "float16", None, plain, "float32"),
    }
    qk = {
        "qk-qwen3": QkNormSpec(128, 128, "bfloat16", "bfloat16", llama),
        "qk-gemma3": QkNormSpec(256, 256, "bfloat16", "float32", gemma),
        "qk-olmo2-fp32": QkNormSpec(4096, 1024, "float32", "float32", NormParams(1e-6, 0.0, before)),
        "qk-wide-ragged": QkNormSpec(8192, 5120, "bfloat16", "bfloat16", llama),
        "qk-fp32-to-bf16": QkNormSpec(128, 128, "float32", "bfloat16", llama, "bfloat16"),
    }

    def jit(variant: object) -> Callable[[Path], str]:
        def build(folder: Path) -> str:
            compile_variant(variant, ptx_dir=folder)
            (ptx,) = folder.glob("*.ptx")
            return ptx.read_text()

        return build

    def aot(make: Callable[..., object], spec: object, tactic: Tactic, arch: str) -> Callable[[Path], str]:
        return lambda folder: make(spec, tactic, arch, folder / "cache").ptx

    unused = KernelCache(Path("/nonexistent"))
    cases: dict[str, Callable[[Path], str]] = {}
    for name, spec in rms.items():
        kernel = RmsNormKernel(spec, unused, hopper)
        cases[f"{name}-prefill"] = jit(kernel.variant(Regime.PREFILL, True))
        cases[f"{name}-decode"] = jit(kernel.variant(Regime.DECODE, True))
    cases["bf16-4096-llama-prefill-scalar"] = jit(
        RmsNormKernel(rms["bf16-4096-llama"], unused, hopper).variant(Regime.PREFILL, False)
    )
    for name, spec in qk.items():
        cases[name] = jit(QkNormKernel(spec, unused, hopper).variant(True))
    cases["qk-qwen3-scalar"] = jit(QkNormKernel(qk["qk-qwen3"], unused, hopper).variant(False))
    for tactic in (Tactic.PREFILL, Tactic.DECODE):
        name = f"aot-bf16-4096-llama-{tactic.name.lower()}"
        cases[name] = aot(rms_norm_artifact, rms["bf16-4096-llama"], tactic, ARCH)
    cases["aot-fp32-to-bf16-4096-sm_80"] = aot(
        rms_norm_artifact, rms["fp32-to-bf16-4096-llama"], Tactic.PREFILL, "sm_80"
    )
    cases["aot-fp16-1001"] = aot(rms_norm_artifact, rms["fp16-1001-llama"], Tactic.PREFILL, ARCH)
    cases["aot-bf16-8192-none-decode"] = aot(rms_norm_artifact, rms["bf16-8192-none"], Tactic.DECODE, ARCH)
    cases["aot-qk-qwen3"] = aot(qk_norm_artifact, qk["qk-qwen3"], Tactic.PREFILL, ARCH)
    cases["aot-qk-wide-ragged-sm_100a"] = aot(qk_norm_artifact, qk["qk-wide-ragged"], Tactic.PREFILL, "sm_100a")
    return cases


def _digest(ptx: str) -> str:
    return hashlib.sha256(ptx.encode()).hexdigest()


def _environment(ptx: str) -> dict[str, str]:
    """What the PTX depends on besides the kernel sources: CuTeDSL's version, its libs flavour, the PTX header."""
    libs = sorted(
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if (d.metadata["Name"] or "").startswith("nvidia-cutlass-dsl-libs-cu")
    )
    header = re.search(r"^// Cuda compilation tools.*$", ptx, re.M)
    version = re.search(r"^\.version \S+$", ptx, re.M)
    return {
        "cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl"),
        "libs": ",".join(libs),
        "ptx_header": header.group(0) if header else "",
        "ptx_version": version.group(0) if version else "",
    }


def record(path: Path) -> None:
    digests: dict[str, str] = {}
    environment: dict[str, str] = {}
    for name, build in _cases().items():
        with tempfile.TemporaryDirectory() as folder:
            ptx = build(Path(folder))
        digests[name] = _digest(ptx)
        environment = environment or _environment(ptx)
        print(name, digests[name], flush=True)
    path.write_text(json.dumps({"environment": environment, "ptx_sha256": digests}, indent=1, sort_keys=True) + "\n")


def test_todays_kernels_compile_to_the_recorded_ptx(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")
    recorded = json.loads(HASHES.read_text())
    cases = _cases()
    assert set(cases) == set(recorded["ptx_sha256"])
    changed = []
    for name, build in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        ptx = build(folder)
        if _environment(ptx) != recorded["environment"]:
            pytest.skip(f"PTX recorded with {recorded['environment']}, this compiler is {_environment(ptx)}")
        if _digest(ptx) != recorded["ptx_sha256"][name]:
            changed.append(name)
    assert not changed, f"PTX changed for {changed}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True, help="write the digests here")
    record(parser.parse_args().record)
    sys.exit(0)
