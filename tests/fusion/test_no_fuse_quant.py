"""`FusionOptions(fuse_quant=False)` (`--no-fuse-quant`) writes exactly what the pass wrote before the quantized ops,
and reports it as it did: the same fused model byte for byte, the same JSON fusion report, the same summary line.

`tests/fusion/test_no_fuse_quant_digests.json` holds, per case and per residual setting, the SHA-256 of the fused
model serialised and of the report (JSON, keys sorted), and the summary line, as the pass gave them at 6d44db2 (the
last commit before the quantized ops), recorded by running this file as a script against that commit's package:

    git archive 6d44db2 | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base:tests python3 tests/fusion/test_no_fuse_quant.py --record OUT.json

The cases are every committed fixture (the ModelOpt INT8 one among them) and the synthetic quantized graphs of the
quantization tests (every pair ModelOpt writes, the pairs that stay out, the inverse root's pair). The bytes depend on
onnx, onnx-graphsurgeon and protobuf too, so the test runs only where their versions are the recorded ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from support.digests import outcome, recorded, write_outcomes
from support.graphs import qdq_norm, residual_near_miss
from support.paths import FIXTURES, REPO_ROOT
from support.quant_graphs import QuantSpec, quantized_decoder, quantized_norm

DIGESTS = Path(__file__).with_name("test_no_fuse_quant_digests.json")
# The residual setting of each recording: the pass's default, and --no-fuse-residual.
SETTINGS = {"default": True, "no-fuse-residual": False}
NORM_CASES = ("input-pair", "shape", "output-dtype", "read", "per-channel", "zero-point", "uint8")
QDQ_PLACES = ("rsqrt", "normalized", "output", "x", "shared-x")


def _cases() -> dict[str, Callable[[], onnx.ModelProto]]:
    cases: dict[str, Callable[[], onnx.ModelProto]] = {
        str(path.relative_to(REPO_ROOT)): lambda path=path: onnx.load(str(path))
        for path in sorted(FIXTURES.glob("**/*.onnx"))
    }
    for dtype in ("float32", "float16", "bfloat16"):
        for quant in ("float8_e4m3fn", "int8"):
            spec = QuantSpec(dtype=dtype, quant=quant)
            cases[f"decoder-{dtype}-{quant}"] = lambda spec=spec: quantized_decoder(spec)
    for dtype in ("float32", "float16"):
        spec = QuantSpec(dtype=dtype, rsqrt_pairs=True)
        cases[f"decoder-rsqrt-{dtype}"] = lambda spec=spec: quantized_decoder(spec)
    cases["decoder-opset13-int8"] = lambda: quantized_decoder(QuantSpec(dtype="float32", opset=13))
    for case in NORM_CASES:
        spec = QuantSpec(dtype="float32", opset=21 if case == "output-dtype" else 19)
        cases[f"norm-{case}"] = lambda case=case, spec=spec: quantized_norm(case, spec)
    for place in QDQ_PLACES:
        cases[f"qdq-{place}"] = lambda place=place: qdq_norm(place)
    cases["residual-near-miss-qdq"] = lambda: residual_near_miss("qdq", "float32")
    return cases


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", sorted(_cases()))
def test_without_the_quantizers_the_output_and_report_are_the_old_ones(name: str, setting: str) -> None:
    from trtfuse.fusion.fuse import fuse_model
    from trtfuse.fusion.options import FusionOptions

    expected = recorded(DIGESTS)
    # The pass before the quantized ops had no rotary op either (tests/fusion/test_no_fuse_rope.py has all flags).
    options = FusionOptions(fuse_residual=SETTINGS[setting], fuse_quant=False, fuse_rope=False)
    result = fuse_model(_cases()[name](), options)
    assert result.search.quant_near_misses is None and result.search.quantizers_taken() == []
    assert outcome(result) == expected[setting][name]


def test_every_case_is_recorded() -> None:
    outcomes = json.loads(DIGESTS.read_text())["outcomes"]
    assert sorted(outcomes) == sorted(SETTINGS)
    assert all(sorted(outcomes[setting]) == sorted(_cases()) for setting in SETTINGS)


def _record(out: Path) -> None:
    """Fuse every case with the package on the path (the commit before the quantized ops, which takes no
    `fuse_quant`)."""
    from trtfuse.fusion.fuse import fuse_model
    from trtfuse.fusion.options import FusionOptions

    outcomes = {
        setting: {
            name: outcome(fuse_model(build(), FusionOptions(fuse_residual=fuse))) for name, build in _cases().items()
        }
        for setting, fuse in SETTINGS.items()
    }
    write_outcomes(out, outcomes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, required=True, help="Write the outcomes here.")
    _record(parser.parse_args().record)
