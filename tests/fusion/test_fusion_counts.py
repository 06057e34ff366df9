"""The one fusion summary line (`FusionCounts.line`): `inspect`, `fuse`, `compile` and the Polygraphy loader's log
count the plugin nodes of the model that comes out, so an already-fused model reports its nodes, not 0; rejected
candidates, and apart from them the residual Adds kept outside a norm fused alone (none of them is a rejected norm),
and the rotations kept outside a fused QK pair, with the same options (`--no-fuse-residual`, `--no-fuse-rope`)
everywhere."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from trtfuse import contract
from trtfuse.fusion.fuse import fuse_model
from trtfuse.fusion.patterns import NearMiss
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.models import layer_norm_model
from support.paths import FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
# The q/k norms with the rotary embedding after them: TrtfuseQkNormRope (2 norms each).
COUNTS = "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 4 TrtfuseAddRmsNorm and 2 TrtfuseQkNormRope nodes (9 norms)"
# ModelOpt's int8 Qwen3: the sum three norms read is quantized first; without the quantizers taken in
# (--no-fuse-quant) those Adds stay out (no rejected norm). Its rotations quantize each product (ModelOpt): without
# the quantizers, kept out of the q/k norms' nodes.
KEPT_OUT_FIXTURE = FIXTURES / "tools" / "qwen3-modelopt-int8-fp16.onnx"
KEPT_OUT_COUNTS = (
    "4 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 1 TrtfuseAddRmsNorm nodes (9 norms), 0 rejected, 3 Adds kept out, "
    "2 rotations kept out"
)
FIRST_KEPT_OUT = " (first: node_add_399: not fused into the norm node_mean_3: the norm reads its sum through the pair "
# With them taken in (the default): 5 output QuantizeLinears and 4 input pairs in the norm nodes, no Add out, and the
# rotations fused with their quantized products (4 pairs and q's output Q a layer).
QUANT_COUNTS = (
    "0 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 1 TrtfuseRmsNormQuant, 4 TrtfuseAddRmsNormQuant and 2 TrtfuseQkNormRopeQuant "
    "nodes (9 norms), 0 rejected, 19 Qs taken in"
)


def _polygraphy_log(
    path: Path, fuse_residual: bool | None = None, fuse_quant: bool | None = None, fuse_rope: bool | None = None
) -> str:
    pytest.importorskip("polygraphy", reason="Polygraphy is not installed (pip install -e '.[compare]')")
    from polygraphy.logger import G_LOGGER

    from trtfuse.polygraphy_ext.loaders import FuseModel

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), G_LOGGER.verbosity(G_LOGGER.INFO):
        FuseModel(str(path), fuse_residual=fuse_residual, fuse_quant=fuse_quant, fuse_rope=fuse_rope)()
    return captured.getvalue()


@pytest.mark.parametrize("already_fused", [False, True], ids=["original", "fused"])
def test_inspect_fuse_compile_and_polygraphy_report_the_same_counts(already_fused, tmp_path):
    model = fuse_file(KV_FIXTURE, tmp_path / "fused.onnx").output_path if already_fused else KV_FIXTURE
    expected = COUNTS + (", all already in the input" if already_fused else "") + ", 0 rejected"
    inspected = run_cli("inspect", model)
    assert inspected.stdout.splitlines()[0] == f"{model}: {expected}"
    fused = run_cli("fuse", model, "-o", tmp_path / "again.onnx")
    assert fused.stdout.strip() == f"{model}: {expected} -> {tmp_path / 'again.onnx'}"
    compiled = run_cli("compile", model, "-o", tmp_path / "m.engine")
    assert compiled.exit_code == 3, compiled.output
    assert compiled.stdout.startswith(f"{model}: {expected} -> {tmp_path / 'm.fused.onnx'}")
    assert f"trtfuse: fused {model}: {expected}\n" in _polygraphy_log(model)


def test_the_counts_are_the_plugin_nodes_of_the_output_and_the_report_holds_them():
    fused = fuse_model(load_model(KV_FIXTURE).model)
    again = fuse_model(fused.model)
    assert again.fused == [] and again.report()["totals"][contract.RMS_NORM_OP] == 0
    assert (
        again.report()["plugin_nodes"]
        == fused.report()["plugin_nodes"]
        == {contract.RMS_NORM_OP: 1, contract.QK_NORM_OP: 0, contract.ADD_RMS_NORM_OP: 4, contract.QK_NORM_ROPE_OP: 2}
    )
    assert again.report()["already_in_input"] == {
        contract.RMS_NORM_OP: 1,
        contract.QK_NORM_OP: 0,
        contract.ADD_RMS_NORM_OP: 4,
        contract.QK_NORM_ROPE_OP: 2,
    }


def test_adds_kept_out_are_counted_apart_from_rejected_norms_everywhere(tmp_path):
    model, flag = KEPT_OUT_FIXTURE, "--no-fuse-quant"
    assert run_cli("inspect", model, flag).stdout.splitlines()[0] == f"{model}: {KEPT_OUT_COUNTS}"
    fused = run_cli("fuse", model, "-o", tmp_path / "fused.onnx", flag).stdout.strip()
    assert fused.startswith(f"{model}: {KEPT_OUT_COUNTS}{FIRST_KEPT_OUT}") and fused.endswith(
        "; 3 more) -> " + str(tmp_path / "fused.onnx")
    )
    compiled = run_cli("compile", model, "-o", tmp_path / "m.engine", flag)
    assert compiled.exit_code == 3, compiled.output
    assert compiled.stdout.startswith(f"{model}: {KEPT_OUT_COUNTS}{FIRST_KEPT_OUT}")
    assert f"trtfuse: fused {model}: {KEPT_OUT_COUNTS}{FIRST_KEPT_OUT}" in _polygraphy_log(model, fuse_quant=False)


def test_quantizers_taken_in_are_counted_everywhere(tmp_path):
    model = KEPT_OUT_FIXTURE
    assert run_cli("inspect", model).stdout.splitlines()[0] == f"{model}: {QUANT_COUNTS}"
    fused = run_cli("fuse", model, "-o", tmp_path / "fused.onnx").stdout.strip()
    assert fused == f"{model}: {QUANT_COUNTS} -> {tmp_path / 'fused.onnx'}"
    compiled = run_cli("compile", model, "-o", tmp_path / "m.engine")
    assert compiled.exit_code == 3, compiled.output
    assert compiled.stdout.startswith(f"{model}: {QUANT_COUNTS} -> ")
    assert f"trtfuse: fused {model}: {QUANT_COUNTS}\n" in _polygraphy_log(model)
    # Fused again, the input's quantized nodes are counted as the output's, and nothing is taken in anew.
    again = run_cli("inspect", tmp_path / "fused.onnx").stdout.splitlines()[0]
    assert again.endswith("(9 norms), all already in the input, 0 rejected"), again


def _every_command_counts(flag: str, expected: str, tmp_path: Path, **polygraphy: bool) -> None:
    """inspect, fuse, compile and the Polygraphy loader, each with `flag` (the loader with `polygraphy`), count
    `expected` on the KV fixture."""
    assert run_cli("inspect", KV_FIXTURE, flag).stdout.splitlines()[0] == f"{KV_FIXTURE}: {expected}"
    fused = run_cli("fuse", KV_FIXTURE, "-o", tmp_path / "fused.onnx", flag)
    assert fused.stdout.strip() == f"{KV_FIXTURE}: {expected} -> {tmp_path / 'fused.onnx'}"
    compiled = run_cli("compile", KV_FIXTURE, "-o", tmp_path / "m.engine", flag)
    assert compiled.exit_code == 3 and compiled.stdout.startswith(f"{KV_FIXTURE}: {expected} -> "), compiled.output
    assert f"trtfuse: fused {KV_FIXTURE}: {expected}\n" in _polygraphy_log(KV_FIXTURE, **polygraphy)


def test_without_the_residual_fusion_every_command_counts_the_norms_fused_alone(tmp_path):
    expected = "5 TrtfuseRmsNorm, 0 TrtfuseQkNorm and 2 TrtfuseQkNormRope nodes (9 norms), 0 rejected"
    _every_command_counts("--no-fuse-residual", expected, tmp_path, fuse_residual=False)


def test_without_the_rotary_fusion_every_command_counts_the_pairs_alone(tmp_path):
    expected = "1 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (9 norms), 0 rejected"
    _every_command_counts("--no-fuse-rope", expected, tmp_path, fuse_rope=False)


def test_the_line_names_the_first_rejected_candidates(write_model):
    line = fuse_model(load_model(write_model(layer_norm_model())).model).counts().line()
    assert line.startswith("0 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (0 norms), 2 rejected (first: ")
    assert "ln/mean: LayerNorm: the squared tensor is x - mean(x)" in line
    counts = fuse_model(load_model(write_model(layer_norm_model())).model).counts()
    many = type(counts)(counts.nodes, counts.already, tuple(NearMiss(f"n{i}", "why") for i in range(5)))
    assert many.line().endswith("5 rejected (first: n0: why; n1: why; 3 more)")
    assert many.line(reasons=0).endswith("5 rejected")
    kept = type(counts)(counts.nodes, counts.already, (NearMiss("n0", "why"),), (NearMiss("add", "because"),))
    assert kept.line().endswith("1 rejected, 1 Add kept out (first: n0: why; add: because)")
    quant = type(counts)(counts.nodes, counts.already, (), (), 3, (NearMiss("q", "read"), NearMiss("r", "too")))
    assert quant.line().endswith("0 rejected, 3 Qs taken in, 2 Qs kept out (first: q: read; r: too)")
    rope = type(counts)(counts.nodes, counts.already, (), (), 0, None, (NearMiss("qk", "turned"),))
    assert rope.line().endswith("0 rejected, 1 rotation kept out (first: qk: turned)")
