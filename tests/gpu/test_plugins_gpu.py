"""The trtfuse plugins on a GPU, driven through TensorRT's IPluginV3 call order by trtfuse.bench.lifecycle: real
CuTeDSL kernels enqueued on raw device pointers and a side stream, checked against a float64 reference (the
add-norm's h bit for bit), host cost per enqueue, and CUDA-graph captures of several enqueues replayed with fresh
inputs. Every op of the contract: RMSNorm, QK-norm and the residual add + RMSNorm.

Needs CUDA (torch), nvidia-cutlass-dsl and TensorRT's plugin types (`tensorrt`, or TensorRT-RTX's `tensorrt_rtx`,
which these tests ask for where `tensorrt` is absent). Run: python3 -m pytest -m gpu tests/gpu/test_plugins_gpu.py -rA
"""

from __future__ import annotations

import os

import pytest

from trtfuse.contract import WeightMode
from trtfuse.errors import MissingDependencyError
from trtfuse.plugins.trt_module import RTX_MODULE, TRT_MODULE_ENV, load_trt

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU plugin tests allocate device memory with torch")
if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device: the GPU plugin tests run on the H200 (python3 -m pytest -m gpu)", allow_module_level=True
    )
os.environ.setdefault(TRT_MODULE_ENV, RTX_MODULE)
try:
    load_trt()
except MissingDependencyError as missing:
    pytest.skip(f"no TensorRT plugin types: {missing}", allow_module_level=True)

from trtfuse.bench.lifecycle.cases import NormCase, add_case, default_cases, qk_case, rms_case  # noqa: E402
from trtfuse.bench.lifecycle.drive import LifecycleReport, drive  # noqa: E402
from trtfuse.bench.lifecycle.graph_replay import GraphReplay, graph_replay  # noqa: E402

# Python's own share of an enqueue, on top of the kernel launch under it: a few attribute reads and one call.
PLUGIN_OVERHEAD_BUDGET_US = 2.0
# Anything near a compilation (tens of ms) or a synchronisation would show up far above this.
ENQUEUE_SANITY_BOUND_US = 200.0
ENQUEUE_TARGET_US = 8.0

CASES = default_cases()


def describe(report: LifecycleReport) -> str:
    lines = [f"{report.case.name}:"]
    for run in report.runs:
        for check in run.checks:
            exact = f", elements not bit-exact {check.differing}" if check.rtol == 0 else ""
            lines.append(
                f"  {run.plugin} plugin, shapes {run.shapes}, {check.name}: max abs {check.max_abs:.3e} "
                f"max rel {check.max_rel:.3e} (rtol {check.rtol:g}){exact}, unwritten elements {check.unwritten}, "
                f"guard tail intact {run.guards_intact}"
            )
    return "\n".join(lines)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lifecycle_enqueues_match_the_float64_reference(case: NormCase) -> None:
    """Build phase, runtime re-creation from the serialised fields, attach, clone, then for a prefill-sized and two
    decode-sized runs: on_shape_change and one enqueue on a side stream into NaN-poisoned outputs. The add-norm's
    cases check y within the normalised outputs' tolerance and h bit for bit against the reference's rounded sum."""
    report = drive(case)
    assert report.passed, describe(report)


@pytest.mark.parametrize(
    "case",
    [
        rms_case(4096, "bfloat16", "bfloat16"),
        qk_case(32, 8, 128, "bfloat16", "bfloat16"),
        add_case(4096, "bfloat16", "bfloat16"),
    ],
    ids=["rms-bf16-4096", "qk-qwen3-bf16", "add-bf16-4096"],
)
def test_enqueue_host_cost(case: NormCase, record_property: pytest.RecordProperty) -> None:
    report = drive(case)
    cost = report.host
    summary = (
        f"{case.name}: enqueue {cost.enqueue_us:.2f} us median (target {ENQUEUE_TARGET_US} us), "
        f"bare kernel launch {cost.launch_us:.2f} us, plugin overhead {cost.enqueue_us - cost.launch_us:.2f} us"
    )
    print(summary)
    record_property("host_cost", summary)
    assert cost.enqueue_us < ENQUEUE_SANITY_BOUND_US, f"enqueue compiles or synchronises: {summary}"
    assert cost.enqueue_us - cost.launch_us <= PLUGIN_OVERHEAD_BUDGET_US, summary


def test_cuda_graph_of_several_enqueues_replays_correctly() -> None:
    """RMSNorm -> RMSNorm (reading the first one's output) -> QK-norm, captured once on a side stream in torch's
    global capture mode (which fails on any allocation or synchronisation), then replayed twice with new inputs."""
    cases = [
        rms_case(4096, "bfloat16", "float32", runs=((1, 8),)),
        rms_case(4096, "bfloat16", None, WeightMode.NONE, runs=((1, 8),)),
        qk_case(32, 8, 128, "bfloat16", "bfloat16", runs=(8,)),
    ]
    replay = graph_replay(cases)
    assert replay.passed, describe_replay(replay)


def test_cuda_graph_of_add_norm_enqueues_replays_correctly() -> None:
    """RMSNorm -> add-norm (x: the RMSNorm's y) -> add-norm without weight (x: the first add-norm's y) -> an fp32
    residual stream's add-norm to bf16, captured once on a side stream and replayed twice with new inputs; every y
    within tolerance, every h bit for bit."""
    cases = [
        rms_case(4096, "bfloat16", "float32", runs=((1, 8),)),
        add_case(4096, "bfloat16", "bfloat16", runs=((1, 8),)),
        add_case(4096, "bfloat16", None, WeightMode.NONE, runs=((1, 8),)),
        add_case(4096, "float32", "bfloat16", runs=((1, 8),), output_dtype="bfloat16"),
    ]
    replay = graph_replay(cases)
    assert [check.name for check in replay.checks[0]] == ["y", "y", "h", "y", "h", "y", "h"]
    assert replay.passed, describe_replay(replay)


def describe_replay(replay: GraphReplay) -> str:
    details = "\n".join(
        f"replay {index}: {check.name} max rel {check.max_rel:.3e} (rtol {check.rtol:g}), unwritten {check.unwritten}"
        + (f", not bit-exact {check.differing}" if check.rtol == 0 else "")
        for index, checks in enumerate(replay.checks)
        for check in checks
    )
    return f"guard tails intact: {replay.guards_intact}\n{details}"
