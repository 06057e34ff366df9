"""CPU/CI: `benchmarks/rope_layouts.py`'s inputs in each head layout (the parts that run before any kernel): the
shapes each node reads and writes, and the float64 check every timed output goes through, passing the reference's
own values and failing a token-major result where the node writes [B, H, S, D]."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("cutlass", reason="trtfuse.bench.rope imports the kernels (nvidia-cutlass-dsl)")
pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.reference import qk_norm_rope_reference
from trtfuse.bench.rope import RopeInputs, check_rotated
from trtfuse.bench.timing import QK_HEADS

from support.paths import REPO_ROOT


def _script():
    spec = importlib.util.spec_from_file_location("rope_layouts", REPO_ROOT / "benchmarks" / "rope_layouts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYOUTS = _script().layout_specs()
Q_HEADS, K_HEADS, HEAD_DIM = QK_HEADS


def _with_reference_outputs(name: str, tokens: int, decode: bool) -> RopeInputs:
    spec = LAYOUTS[name]
    inputs = RopeInputs(tokens, decode, 2, spec, device="cpu")
    for part in (0, 1):
        x, w = inputs.ins[0][part], inputs.weights[part]
        reference = qk_norm_rope_reference(x, w, *inputs.tables[0], spec, part, inputs.batch, inputs.seq_len)[0]
        inputs.outs[0][part].copy_(reference)
    return inputs


@pytest.mark.parametrize(
    ("name", "q_in", "q_out"),
    [
        ("token-major", (1, 6, Q_HEADS, HEAD_DIM), (1, 6, Q_HEADS, HEAD_DIM)),
        ("head-major", (1, Q_HEADS, 6, HEAD_DIM), (1, Q_HEADS, 6, HEAD_DIM)),
        ("writes head-major", (1, 6, Q_HEADS, HEAD_DIM), (1, Q_HEADS, 6, HEAD_DIM)),
    ],
)
def test_each_layout_reads_and_writes_its_shapes_and_its_reference_passes(name, q_in, q_out) -> None:
    inputs = _with_reference_outputs(name, 6, decode=False)
    assert tuple(inputs.ins[0][0].shape) == q_in and tuple(inputs.outs[0][0].shape) == q_out
    assert tuple(inputs.tables[0][0].shape) == (1, 6, HEAD_DIM)
    assert inputs.extents(0) == (1, 6, 1) and inputs.rows == (6 * Q_HEADS, 6 * K_HEADS)
    assert check_rotated(inputs.outs[0], inputs, 0, name) == 0.0


def test_decode_puts_each_sequence_at_its_own_position() -> None:
    inputs = _with_reference_outputs("head-major", 3, decode=True)
    assert tuple(inputs.ins[0][1].shape) == (3, K_HEADS, 1, HEAD_DIM) and inputs.extents(0) == (3, 1, 3)
    assert check_rotated(inputs.outs[0], inputs, 0, "head-major decode") == 0.0


def test_a_token_major_result_where_the_node_writes_head_major_fails_the_check() -> None:
    inputs = _with_reference_outputs("writes head-major", 6, decode=False)
    token_major = _with_reference_outputs("token-major", 6, decode=False)
    q_out = inputs.outs[0][0]
    q_out.copy_(token_major.outs[0][0].reshape(q_out.shape))
    with pytest.raises(AssertionError, match="max rel error"):
        check_rotated(inputs.outs[0], inputs, 0, "writes head-major")
