"""How `check` holds memory (docs/performance.md, "check memory"): one onnxruntime session alive at a time, each
released after its last step; the large weights read by onnxruntime from their external data files, never loaded into
the proto it is given; each 16-bit weight's float32 copy made just before the op that reads it; outputs that do not
keep a released session's buffers alive. `compare` against an engine holds the engine the same way: loaded after the
original is released, released before the float32 evaluation loads."""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from trtfuse.fusion.fuse import fuse_model
from trtfuse.generate.agreement import GenerationRequest, check_generation
from trtfuse.model import onnx_file
from trtfuse.model.feeds import default_feeds
from trtfuse.model.onnx_file import load_model, save_model
from trtfuse.verify.check import check_fused
from trtfuse.verify.onnxrt import CpuSession, onnxruntime_session
from trtfuse.verify.widening import widen_to_float32

from fakes.sessions import OnnxrtEngineSession
from support.paths import FIXTURES

FP16_FIXTURE = FIXTURES / "llama-dynamo-fp16.onnx"
KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
FP8_KV_FIXTURE = FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx"
# Tensors above this go to the external data file, and `load_model` leaves them there: the fixtures' matmul weights
# and embeddings (8 KiB and more), not their norm weights, epsilons and shapes.
LARGE_TENSOR_BYTES = 4096


class SessionLedger:
    """Every onnxruntime session made while it is installed: the model each was given, and how many were alive at
    once at the most (a session counts as gone when Python frees it, no garbage collection asked for)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.models: list[onnx.ModelProto] = []
        self.alive = 0
        self.most_alive = 0
        real = onnxruntime.InferenceSession

        def make(model: bytes, *args: object, **kwargs: object) -> object:
            session = real(model, *args, **kwargs)
            self.models.append(onnx.load_from_string(model))
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
            weakref.finalize(session, self._freed)
            return session

        monkeypatch.setattr(onnxruntime, "InferenceSession", make)

    def _freed(self) -> None:
        self.alive -= 1


def _with_external_weights(source: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """`source` and its fused model in `folder`, every tensor above LARGE_TENSOR_BYTES in one external data file they
    share, and `load_model` leaving those tensors on disk (as it leaves a real export's weights)."""
    monkeypatch.setattr(onnx_file, "SMALL_TENSOR_BYTES", LARGE_TENSOR_BYTES)
    original = folder / "model.onnx"
    onnx.save_model(
        onnx.load(str(source)),
        str(original),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=LARGE_TENSOR_BYTES + 1,
    )
    loaded = load_model(original)
    fused = folder / "model.fused.onnx"
    save_model(fuse_model(loaded.model).model, fused, source=loaded)
    return original, fused


def test_check_holds_one_session_at_a_time_and_releases_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original, fused = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    ledger = SessionLedger(monkeypatch)
    result = check_fused(load_model(original), load_model(fused))
    assert result.passed and result.judged_by == "float32 evaluation"
    # The original, the lowered fused model, the float32 evaluation, then each fused node on the original's tensors
    # and the float32 evaluation of the original's ops there, one after the other.
    assert len(ledger.models) == 5
    assert ledger.most_alive == 1
    assert ledger.alive == 0
    # The last two hold the norms' weights and constants alone: no tensor larger than a row of the hidden size (64).
    for model in ledger.models[3:]:
        assert max(int(np.prod(tensor.dims)) for tensor in model.graph.initializer) == 64


def test_check_generate_holds_one_session_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original, fused = _with_external_weights(KV_FIXTURE, tmp_path, monkeypatch)
    ledger = SessionLedger(monkeypatch)
    verdict = check_generation(load_model(original), load_model(fused), GenerationRequest(3))
    assert verdict.passed and len(verdict.original.steps) == 3
    assert len(ledger.models) == 2
    assert ledger.most_alive == 1
    assert ledger.alive == 0


def test_the_quantizer_flip_runs_hold_one_session_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The FP8 fixture diverges beyond a near tie: the nudged original and the fused model run again, in turn.
    original, fused = _with_external_weights(FP8_KV_FIXTURE, tmp_path, monkeypatch)
    ledger = SessionLedger(monkeypatch)
    verdict = check_generation(load_model(original), load_model(fused), GenerationRequest(16))
    assert verdict.passed and verdict.divergence is not None and verdict.divergence.flips is not None
    assert len(ledger.models) == 4
    assert ledger.most_alive == 1
    assert ledger.alive == 0


def test_sessions_read_the_weights_from_their_external_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, fused = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    on_disk = {tensor.name for tensor in onnx_file.external_tensors(onnx.load(str(original), load_external_data=False))}
    assert on_disk
    ledger = SessionLedger(monkeypatch)
    check_fused(load_model(original), load_model(fused))
    for index, model in enumerate(ledger.models):
        external = {tensor.name.removesuffix("/stored") for tensor in onnx_file.external_tensors(model)}
        # The original, the lowered fused model and the float32 evaluation hold every weight; the models that judge
        # each fused node only the norms' (none of which is on disk).
        assert on_disk <= external if index < 3 else not external
        assert max(len(tensor.raw_data) for tensor in model.graph.initializer) <= LARGE_TENSOR_BYTES


def test_the_float32_evaluation_casts_each_weight_just_before_its_first_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, _ = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    nodes = list(widen_to_float32(load_model(original).model).graph.node)
    casts = [index for index, node in enumerate(nodes) if node.name.endswith("/stored/widen")]
    assert len(casts) == len(onnx_file.external_tensors(load_model(original).model))
    for index in casts:
        # At the front of the graph, every weight's float32 copy was made at once.
        assert nodes[index].output[0] in nodes[index + 1].input, nodes[index].name


def test_onnxruntime_runs_each_node_by_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original, _ = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    session = onnxruntime_session(load_model(original))
    # The default order ran the Casts onnxruntime inserts before its float32 MatMuls all first.
    assert session.get_session_options().execution_order == onnxruntime.ExecutionOrder.PRIORITY_BASED


def test_outputs_are_not_views_of_the_sessions_buffers() -> None:
    loaded = load_model(KV_FIXTURE)
    outputs = CpuSession(loaded).run(default_feeds(loaded.model, seed=0)[0].feed)
    assert all(isinstance(value, np.ndarray) and value.flags.owndata for value in outputs.values())


def test_a_released_session_loads_again_on_its_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(KV_FIXTURE)
    feed = default_feeds(loaded.model, seed=0)[0].feed
    ledger = SessionLedger(monkeypatch)
    session = CpuSession(loaded)
    with session:
        first = session.run(feed)
    assert not session.loaded and ledger.alive == 0
    again = session.run(feed)
    assert len(ledger.models) == 2
    for name, array in first.items():
        np.testing.assert_array_equal(again[name], array)


def test_the_original_model_proto_is_left_as_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original, fused = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    loaded = load_model(original)
    before = loaded.model.SerializeToString()
    check_fused(loaded, load_model(fused))
    # No weight was read into it: the sessions read them from the file.
    assert loaded.model.SerializeToString() == before


def test_compare_loads_the_engine_after_the_original_and_releases_it_before_the_float32_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trtfuse.engine import compare as compare_module
    from trtfuse.engine import session as session_module
    from trtfuse.verify.onnxrt import lowered_session

    original, fused = _with_external_weights(FP16_FIXTURE, tmp_path, monkeypatch)
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine")
    # The engine's runtime is the lowered fused model in onnxruntime (no TensorRT here): the ledger counts it as a
    # session from the engine's load to its release.
    monkeypatch.setattr(compare_module, "import_tensorrt", lambda: object())
    engine_runtime = OnnxrtEngineSession.running(lowered_session(load_model(fused), evaluator=False))
    monkeypatch.setattr(session_module, "EngineSession", engine_runtime)
    ledger = SessionLedger(monkeypatch)
    lines: list[str] = []
    report = compare_module.compare(original, engine, notify=lines.append)
    assert report.passed and report.result.judged_by == "float32 evaluation"
    assert len(ledger.models) == 3
    assert ledger.most_alive == 1
    assert ledger.alive == 0
    loads = [line.split(":")[0] for line in lines if line.startswith("loading ")]
    assert loads == [
        "loading the original in onnxruntime",
        "loading the engine in TensorRT",
        "loading the float32 evaluation of the original in onnxruntime",
    ]
    engine_load = next(index for index, line in enumerate(lines) if line.startswith("loading the engine"))
    assert all(line.startswith("the original:") for line in lines[1:engine_load])
