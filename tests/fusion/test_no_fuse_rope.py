"""`FusionOptions(fuse_rope=False)` (`--no-fuse-rope`) writes exactly what the pass wrote before the rotary op, and
reports it as it did: the same fused model byte for byte, the same JSON fusion report, the same summary line.

`tests/fusion/test_no_fuse_rope_digests.json` holds, per case, the SHA-256 of the fused model serialised and of the
report (JSON, keys sorted), and the summary line, as the pass gave them at cabe64a (the last commit before the rotary
op, with TrtfuseQkNormQuant's per-part stages; every case but the two whose QK-norm quantizers those stages changed,
Gemma3 and OLMo2 ModelOpt INT8, gives what d9b78ea gave), recorded by running this file as a script against that
commit's package:

    git archive cabe64a | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base:tests python3 tests/fusion/test_no_fuse_rope.py --record OUT.json

The cases are every committed fixture and the synthetic rotated attention blocks of tests/fusion/test_rope.py (every
spelling taken, every form kept out). The bytes depend on onnx, onnx-graphsurgeon and protobuf too, so the test
runs only where their versions are the recorded ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from support.digests import outcome, recorded, write_outcomes
from support.paths import FIXTURES, REPO_ROOT, fixture_models
from support.rope_graphs import ROPE_NEAR_MISSES, RopeSpec, rope_block

DIGESTS = Path(__file__).with_name("test_no_fuse_rope_digests.json")
SPECS = {
    "qwen3": RopeSpec(),
    "qwen3-fp16-torchscript-bounds": RopeSpec(dtype="float16", spelling="rotate-half-shapes"),
    "gemma3-bf16": RopeSpec(layout="qk-head-dim-transposed", dtype="bfloat16", weight="before-cast"),
    "olmo2-float32-rotation": RopeSpec(layout="qk-full-width", dtype="float16", table_dtype="float32"),
    "partial": RopeSpec(rotary_dim=8),
    "rotary-embedding-positions-interleaved": RopeSpec(spelling="rotary-embedding", positions=True, interleaved=True),
    "int8": RopeSpec(quant="int8"),
    "fp8-gemma3": RopeSpec(layout="qk-head-dim-transposed", quant="float8_e4m3fn"),
    **{f"kept-out-{case}": RopeSpec(case=case) for case in ROPE_NEAR_MISSES},
}


def _cases() -> dict[str, Callable[[], onnx.ModelProto]]:
    cases: dict[str, Callable[[], onnx.ModelProto]] = {
        str(path.relative_to(REPO_ROOT)): lambda path=path: onnx.load(str(path))
        for path in fixture_models(FIXTURES, "**/*.onnx")
    }
    cases.update({f"rope-{name}": lambda spec=spec: rope_block(spec) for name, spec in SPECS.items()})
    return cases


@pytest.mark.parametrize("name", sorted(_cases()))
def test_without_the_rotary_fusion_the_output_and_report_are_the_old_ones(name: str) -> None:
    from trtfuse.fusion.fuse import fuse_model
    from trtfuse.fusion.options import FusionOptions

    expected = recorded(DIGESTS)
    result = fuse_model(_cases()[name](), FusionOptions(fuse_rope=False))
    assert result.search.rope_near_misses is None and result.search.qk_norm_ropes == []
    assert outcome(result) == expected[name]


def test_every_case_is_recorded() -> None:
    assert sorted(json.loads(DIGESTS.read_text())["outcomes"]) == sorted(_cases())


def _record(out: Path) -> None:
    """Fuse every case with the package on the path (the commit before the rotary op, which takes no `fuse_rope`)."""
    from trtfuse.fusion.fuse import fuse_model

    outcomes = {name: outcome(fuse_model(build())) for name, build in _cases().items()}
    write_outcomes(out, outcomes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, required=True, help="Write the outcomes here.")
    _record(parser.parse_args().record)
