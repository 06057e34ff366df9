"""`FusionOptions(fuse_residual=False)` (`--no-fuse-residual`, with `--no-fuse-quant` on a quantized model) writes
exactly what the pass wrote before the add-norm.

`tests/fusion/test_no_fuse_residual_digests.json` holds the SHA-256 of each case's fused model, serialised, as the
pass wrote it at 926733c (the last commit without the add-norm matcher), recorded by running this file as a script
against that commit's package:

    git archive 926733c | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base:tests python3 tests/fusion/test_no_fuse_residual.py --record OUT.json

The cases are every committed fixture and the synthetic graphs of the residual tests. The bytes depend on onnx,
onnx-graphsurgeon and protobuf too, so the test runs only where their versions are the recorded ones.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from support.graphs import residual_near_miss, residual_stack, skip_norm
from support.paths import FIXTURES, REPO_ROOT, fixture_models

DIGESTS = Path(__file__).with_name("test_no_fuse_residual_digests.json")
PACKAGES = ("onnx", "onnx_graphsurgeon", "protobuf")
NEAR_MISSES = ("bias", "broadcast", "chain", "widened", "rounded", "shared")


def _cases() -> dict[str, Callable[[], onnx.ModelProto]]:
    cases: dict[str, Callable[[], onnx.ModelProto]] = {
        str(path.relative_to(REPO_ROOT)): lambda path=path: onnx.load(str(path))
        for path in fixture_models(FIXTURES, "**/*.onnx")
    }
    for dtype in ("float32", "float16", "bfloat16"):
        cases[f"residual-stack-{dtype}"] = lambda dtype=dtype: residual_stack(dtype, sums_as_outputs=True)
    for case in NEAR_MISSES:
        cases[f"residual-near-miss-{case}"] = lambda case=case: residual_near_miss(case)
    for dtype in ("float32", "float16"):
        for bias in (False, True):
            for sum_output in (False, True):
                name = f"skip-{dtype}-{'bias' if bias else 'no-bias'}-{'sum' if sum_output else 'no-sum'}"
                cases[name] = lambda dtype=dtype, bias=bias, sum_output=sum_output: skip_norm(dtype, bias, sum_output)
    return cases


def _environment() -> dict[str, str]:
    return {package: importlib.metadata.version(package) for package in PACKAGES}


def _digest(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def _recorded() -> dict:
    recorded = json.loads(DIGESTS.read_text())
    if recorded["environment"] != _environment():
        pytest.skip(f"recorded with {recorded['environment']}, this is {_environment()}")
    return recorded["sha256"]


@pytest.mark.parametrize("name", sorted(_cases()))
def test_without_the_residual_fusion_the_output_is_the_old_one_byte_for_byte(name: str) -> None:
    from trtfuse.fusion.fuse import fuse_model
    from trtfuse.fusion.options import FusionOptions

    recorded = _recorded()
    # The pass before the add-norm had no quantized or rotary ops either: on a quantized model --no-fuse-residual
    # alone still takes the Q/DQ pairs into TrtfuseRmsNormQuant nodes (tests/fusion/test_no_fuse_quant.py has both
    # flags), and the rotations into TrtfuseQkNormRope nodes (tests/fusion/test_no_fuse_rope.py).
    fused = fuse_model(_cases()[name](), FusionOptions(fuse_residual=False, fuse_quant=False, fuse_rope=False))
    assert fused.search.add_norms == [] and fused.search.residual_near_misses == []
    assert _digest(fused.model) == recorded[name]


def test_every_case_is_recorded() -> None:
    assert sorted(json.loads(DIGESTS.read_text())["sha256"]) == sorted(_cases())


def _record(out: Path) -> None:
    """Fuse every case with the package on the path (the commit before the add-norm matcher: no options)."""
    from trtfuse.fusion.fuse import fuse_model

    digests = {name: _digest(fuse_model(build()).model) for name, build in _cases().items()}
    out.write_text(json.dumps({"environment": _environment(), "sha256": digests}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, required=True, help="Write the digests here.")
    _record(parser.parse_args().record)
