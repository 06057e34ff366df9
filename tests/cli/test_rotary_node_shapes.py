"""`check` on a fused model whose rotary node was edited so that its inputs no longer fit it: a flipped `layout`
(its heads read as its tokens), q and k swapped at equal widths, or a ModelOpt FP8 node's `output_layout` turned back
to TOKEN_MAJOR (its outputs then [B, S, H, D] where the attention reads [B, H, S, D]). Each is one line naming the
node and its inputs, exit 2, before onnxruntime runs (whose broadcast or Reshape error, with a misleading `--dim`
hint, was all a user saw)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from trtfuse import contract

from support.cli import run_cli
from support.paths import FIXTURES

ORIGINAL = FIXTURES / "qwen3-dynamo-fp32.onnx"
ROTARY_OPS = (contract.QK_NORM_ROPE.name, contract.quantized(contract.QK_NORM_ROPE).name)


def _flip_layout(node: onnx.NodeProto) -> None:
    """Both layouts flipped together (a node reading and writing the other layout: valid fields, wrong shapes)."""
    for attribute in node.attribute:
        if attribute.name in (contract.ATTR_LAYOUT, contract.ATTR_OUTPUT_LAYOUT):
            attribute.i = 1 - attribute.i


def _reverse_layouts(node: onnx.NodeProto) -> None:
    """layout HEAD_MAJOR, output_layout TOKEN_MAJOR: fields no node may have."""
    for attribute in node.attribute:
        if attribute.name in (contract.ATTR_LAYOUT, contract.ATTR_OUTPUT_LAYOUT):
            attribute.i = int(attribute.name == contract.ATTR_LAYOUT)


def _swap_q_and_k(node: onnx.NodeProto) -> None:
    node.input[0], node.input[1] = node.input[1], node.input[0]


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rotary") / "fused.onnx"
    result = run_cli("fuse", ORIGINAL, "-o", path)
    assert result.exit_code == 0, result.output
    return path


def _edited(fused: Path, edit: Callable[[onnx.NodeProto], None], tmp_path: Path) -> tuple[Path, str]:
    model = onnx.load(str(fused))
    (first, *_rest) = [node for node in model.graph.node if node.op_type in ROTARY_OPS]
    edit(first)
    path = tmp_path / "edited.onnx"
    onnx.save(model, str(path))
    return path, first.name


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_flip_layout, "differ in batch or tokens as layout HEAD_MAJOR reads them"),
        (_swap_q_and_k, "must have one shape (inputs swapped?)"),
    ],
)
def test_a_rotary_node_its_inputs_do_not_fit_is_one_line_naming_it(
    fused: Path, tmp_path: Path, edit: Callable[[onnx.NodeProto], None], problem: str
) -> None:
    edited, name = _edited(fused, edit, tmp_path)
    result = run_cli("check", ORIGINAL, edited)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert f"{edited}: node '{name}': input" in line
    assert problem in line
    assert "onnxruntime" not in line and "--dim" not in line


def test_the_fused_model_as_written_passes(fused: Path) -> None:
    result = run_cli("check", ORIGINAL, fused)
    assert result.exit_code == 0, result.output


def test_a_node_reading_head_major_and_writing_token_major_is_one_line_naming_the_field(
    fused: Path, tmp_path: Path
) -> None:
    edited, name = _edited(fused, _reverse_layouts, tmp_path)
    result = run_cli("check", ORIGINAL, edited)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.endswith(
        f"{edited}: node '{name}': attribute output_layout is 0 (TOKEN_MAJOR), but layout is 1 (HEAD_MAJOR): "
        "a node moves heads only forward"
    )


def test_generate_holds_a_rotary_node_to_its_shapes_before_onnxruntime_runs(fused: Path, tmp_path: Path) -> None:
    """`generate` on the CPU checks the rotary nodes at its first step's shapes as `check` does: a flipped layout is
    the same one line naming the node, exit 2."""
    edited, name = _edited(fused, _flip_layout, tmp_path)
    result = run_cli("generate", edited, "--no-cache", "--steps", "2")
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert f"{edited}: node '{name}': input" in line and "differ in batch or tokens" in line
    assert "onnxruntime" not in line
    assert run_cli("generate", fused, "--no-cache", "--steps", "2").exit_code == 0


def _output_layout_back(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.name == contract.ATTR_OUTPUT_LAYOUT:
            attribute.i = int(contract.HeadLayout.TOKEN_MAJOR)


@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_node_writing_token_major_where_its_output_is_declared_head_major_is_one_line_naming_it(
    tmp_path: Path, command: str
) -> None:
    """Its outputs keep their rank and are declared with symbols ([B', H, S', D]): the sizes the fed shapes give
    the symbols q's declared dims share show the heads where its tokens go, before onnxruntime's Reshape error."""
    original = FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx"
    fused = tmp_path / "fused.onnx"
    assert run_cli("fuse", original, "-o", fused).exit_code == 0
    edited, name = _edited(fused, _output_layout_back, tmp_path)
    result = run_cli("check", original, edited) if command == "check" else run_cli("generate", edited, "--steps", "2")
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert f"{edited}: node '{name}': input 'view' [" in line and "must have one shape" in line
    assert "onnxruntime" not in line


@pytest.mark.parametrize(
    "placeholders",
    [
        pytest.param(((0, 1, 3), (1, 1, 3), (2, 1, 3), (3, 1, 3)), id="every-unknown-dim"),
        pytest.param(((0, 2), (2, 2), (3, 2)), id="q-heads-and-the-outputs-heads"),
    ],
)
def test_a_placeholder_symbol_sizes_no_other_part_and_no_two_axes(
    fused: Path, tmp_path: Path, placeholders: tuple[tuple[int, ...], ...]
) -> None:
    """ModelOpt's AutoCast exports declare q, k and the rotated outputs `[batch, unk, sequence, unk]`: one symbol for
    heads and head dim alike, so q's fed shape gives it two sizes and it names none. Nor does a symbol of q size k's
    output (here q and both outputs `unk` at the heads, k's heads static): `check` and `generate` pass (each case
    failed naming k's output, whose 1 head was read as q's 2). `placeholders`: (the node's input 0, 1 or output 2, 3;
    the axes made `unk`)."""
    model = onnx.load(str(fused))
    (node, *_rest) = [node for node in model.graph.node if node.op_type in ROTARY_OPS]
    values = {value.name: value for value in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    tensors = (*node.input[:2], *node.output)
    for position, *axes in placeholders:
        dims = values[tensors[position]].type.tensor_type.shape.dim
        assert len(dims) == 4
        for axis in axes:
            dims[axis].Clear()
            dims[axis].dim_param = "unk"
    edited = tmp_path / "placeholders.onnx"
    onnx.save(model, str(edited))
    assert run_cli("check", ORIGINAL, edited).exit_code == 0
    assert run_cli("generate", edited, "--no-cache", "--steps", "2").exit_code == 0
