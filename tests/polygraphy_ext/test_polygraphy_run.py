"""`polygraphy run` with trtfuse's runners (trtfuse.polygraphy_ext), run as the user runs it: Polygraphy's command in
a subprocess, with Polygraphy's own data loader, shape options and verdict. The entry point is registered by
`pip install -e .` (pyproject.toml, group `polygraphy.run.plugins`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("polygraphy", reason="Polygraphy is not installed (pip install -e '.[compare]')")

from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType
from polygraphy.exception import PolygraphyException

from trtfuse import contract
from trtfuse.contract import PluginKind
from trtfuse.engine import session as session_module
from trtfuse.engine.build import BuildResult, tool_versions
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile, ShapeRange, derive_profiles, request_from_options
from trtfuse.engine.session import EngineSession
from trtfuse.engine.sidecar import make_sidecar, sidecar_path_for
from trtfuse.errors import MissingDependencyError, TrtfuseError
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file
from trtfuse.polygraphy_ext import loaders, runners
from trtfuse.polygraphy_ext.loaders import engine_profiles_for

from support.engines import engine_in_memory, write_engine_files
from support.markers import HAS_TENSORRT, NO_TENSORRT
from support.paths import FIXTURES, TOOL_FIXTURES

# The `polygraphy` script of this interpreter's environment; a virtual environment that sees the system's packages
# has no script of its own, so fall back to the one on PATH.
_BESIDE_PYTHON = Path(sys.executable).with_name("polygraphy")
POLYGRAPHY = _BESIDE_PYTHON if _BESIDE_PYTHON.exists() else Path(shutil.which("polygraphy") or _BESIDE_PYTHON)
ALL_MATCHED = "PASSED | simple | All outputs matched"
# Polygraphy's --onnxrt runs the original with onnxruntime's graph optimisations, which compute fp16 chains in
# float32; --trtfuse-onnxrt rounds every 16-bit value where the graph says (as `trtfuse check` does). The two differ
# by 1-2 fp16 ulps (at most 7.3e-4 in the fixtures' logits, also where nothing is fused: GPT-2; 1.95e-3 in the
# optimum export's key cache, of magnitude 2-4): 2e-3 relative (2 ulps) plus 2e-3 absolute for values near 0.
FP16_TOLERANCE = ("--atol", "2e-3", "--rtol", "2e-3")
# (fixture, the fused counts the runner's log line must show, tolerance options)
FIXTURE_CASES = [
    (
        "qwen3-dynamo-fp32.onnx",
        "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 4 TrtfuseAddRmsNorm and 2 TrtfuseQkNormRope nodes (9 norms), 0 rejected",
        (),
    ),
    (
        "deepseek_v3-dynamo-fp32.onnx",
        "1 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (9 norms), 3 rejected",
        (),
    ),
    (
        "llama-torchscript-fp16.onnx",
        "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (5 norms), 0 rejected",
        FP16_TOLERANCE,
    ),
    (
        "gemma3-torchscript-fp16.onnx",
        "5 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 4 TrtfuseAddRmsNorm and 2 TrtfuseQkNormRope nodes (13 norms), 0 rejected",
        FP16_TOLERANCE,
    ),
]


def polygraphy_run(*args: str, patch: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`polygraphy run ARGS`; with `patch`, Python run first in the same process (Polygraphy's main then runs)."""
    if patch is None:
        command = [str(POLYGRAPHY), "run", *args]
    else:
        main = (
            "from polygraphy.tools._main import main\nsys.argv = ['polygraphy', 'run', *sys.argv[1:]]\nsys.exit(main())"
        )
        command = [sys.executable, "-c", f"import sys\n{patch}\n{main}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def test_entry_point_adds_both_runners():
    entry_points = metadata.entry_points().select(group="polygraphy.run.plugins")
    assert [point.value for point in entry_points if point.name == "trtfuse"] == [
        "trtfuse.polygraphy_ext.args:export_argument_groups"
    ], "the entry point is missing: `pip install -e .` again after editing pyproject.toml"
    result = polygraphy_run("-h")
    assert result.returncode == 0, output_of(result)
    for option in ("--trtfuse-onnxrt", "--trtfuse ", "--trtfuse-profile", "--trtfuse-cache"):
        assert option in result.stdout
    assert "Failed to load plugin" not in output_of(result)


@pytest.mark.parametrize(("fixture", "fused", "tolerance"), FIXTURE_CASES)
def test_fused_model_matches_the_original(fixture, fused, tolerance):
    result = polygraphy_run(
        str(FIXTURES / fixture), "--onnxrt", "--trtfuse-onnxrt", "--input-shapes", "input_ids:[2,8]", *tolerance
    )
    output = output_of(result)
    assert result.returncode == 0, output
    assert f": {fused}" in output
    assert re.search(r"Accuracy Comparison \| onnxrt-runner-\S+ vs\. trtfuse-onnxrt-runner-", output), output
    assert ALL_MATCHED in output


def _shape_options(model_path: Path, dims: dict[str, int]) -> list[str]:
    """Polygraphy's --input-shapes for every graph input, each symbolic dim (or sum of dims) set from `dims`."""
    shapes = []
    for value in onnx.load(str(model_path), load_external_data=False).graph.input:
        sizes = [
            dim.dim_value if dim.HasField("dim_value") else sum(dims[term.strip()] for term in dim.dim_param.split("+"))
            for dim in value.type.tensor_type.shape.dim
        ]
        shapes.append(f"{value.name}:[{','.join(map(str, sizes))}]")
    return ["--input-shapes", *shapes]


def test_kv_cache_model_matches_with_polygraphy_shapes_and_data_loader():
    fixture = FIXTURES / "tools" / "qwen3-optimum-fp16.onnx"
    dims = {"batch_size": 1, "sequence_length": 3, "past_sequence_length": 5}
    shapes = _shape_options(fixture, dims)
    assert "attention_mask:[1,8]" in shapes
    result = polygraphy_run(
        str(fixture), "--onnxrt", "--trtfuse-onnxrt", *shapes, "--val-range", "attention_mask:[1,1]", *FP16_TOLERANCE
    )
    output = output_of(result)
    assert result.returncode == 0, output
    counts = "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 4 TrtfuseAddRmsNorm and 2 TrtfuseQkNormRope nodes (9 norms)"
    assert f": {counts}, 0 rejected" in output
    for name in ("logits", "present.0.key", "present.1.value"):
        assert f"PASSED | Output: '{name}'" in output
    assert ALL_MATCHED in output


# A fusion bug in its most common form: the weight applied as (1 + w), Gemma's form, to a model that scales by w.
CORRUPT_FIRST_NORM = f"""
import onnx.helper
import trtfuse.polygraphy_ext.loaders as loaders
fuse = loaders.fuse_model
def corrupted(model, *options):
    result = fuse(model, *options)
    node = next(node for node in result.model.graph.node if node.domain == {contract.ONNX_DOMAIN!r})
    for attribute in node.attribute:
        if attribute.name == {contract.ATTR_WEIGHT_OFFSET!r}:
            attribute.CopyFrom(onnx.helper.make_attribute(attribute.name, 1.0))
    print("corrupted fused node", node.name, flush=True)
    return result
loaders.fuse_model = corrupted
"""


def test_a_corrupted_fused_node_fails_the_comparison():
    result = polygraphy_run(
        str(FIXTURES / "qwen3-dynamo-fp32.onnx"),
        "--onnxrt",
        "--trtfuse-onnxrt",
        "--input-shapes",
        "input_ids:[2,8]",
        patch=CORRUPT_FIRST_NORM,
    )
    output = output_of(result)
    assert "corrupted fused node" in output
    assert result.returncode != 0, output
    assert "FAILED | simple | Mismatched outputs: ['logits']" in output


def test_generated_script_imports_trtfuse_and_reproduces_the_run(tmp_path):
    script = tmp_path / "compare_fused.py"
    model = str(FIXTURES / "qwen3-dynamo-fp32.onnx")
    result = polygraphy_run(
        model, "--onnxrt", "--trtfuse-onnxrt", "--input-shapes", "input_ids:[2,8]", "--gen", str(script)
    )
    assert result.returncode == 0, output_of(result)
    text = script.read_text()
    assert "from trtfuse.polygraphy_ext import FuseModel, FusedOnnxrtRunner, LowerFusedNodes" in text
    assert f"FuseModel({model!r})" in text
    assert "FusedOnnxrtRunner(lower_fused_nodes)" in text
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "trtfuse-onnxrt-runner" in output
    assert ALL_MATCHED in output


# Each fusion flag, the model it shows on, its input shape, the FuseModel argument and the counts the script logs.
FUSION_FLAGS = {
    "--trtfuse-no-fuse-residual": (
        FIXTURES / "qwen3-dynamo-fp32.onnx",
        "input_ids:[2,8]",
        "fuse_residual=False",
        "5 TrtfuseRmsNorm, 0 TrtfuseQkNorm and 2 TrtfuseQkNormRope nodes (9 norms), 0 rejected",
    ),
    # What trtfuse wrote before the rotary op: the q/k pairs without their rotation.
    "--trtfuse-no-fuse-rope": (
        FIXTURES / "qwen3-dynamo-fp32.onnx",
        "input_ids:[2,8]",
        "fuse_rope=False",
        "1 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (9 norms), 0 rejected",
    ),
    # What trtfuse wrote before the quantized ops: the three Adds whose sums are quantized stay out.
    "--trtfuse-no-fuse-quant": (
        TOOL_FIXTURES / "qwen3-modelopt-int8-fp16.onnx",
        "input_ids:[2,5]",
        "fuse_quant=False",
        "4 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 1 TrtfuseAddRmsNorm nodes (9 norms), 0 rejected, 3 Adds kept out, "
        "2 rotations kept out",
    ),
}


@pytest.mark.parametrize("flag", sorted(FUSION_FLAGS))
def test_a_fusion_flag_reaches_the_fuse_loader(flag, tmp_path):
    path, shape, argument, counts = FUSION_FLAGS[flag]
    script = tmp_path / "compare_fused.py"
    model = str(path)
    result = polygraphy_run(model, "--trtfuse-onnxrt", flag, "--input-shapes", shape, "--gen", str(script))
    assert result.returncode == 0, output_of(result)
    assert f"FuseModel({model!r}, {argument})" in script.read_text()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert f": {counts}" in output


def test_generated_script_passes_polygraphy_profiles_and_build_options_to_trtfuse(tmp_path):
    result = polygraphy_run(
        str(FIXTURES / "qwen3-dynamo-fp32.onnx"),
        "--onnxrt",
        "--trtfuse",
        "--trtfuse-profile",
        "decode",
        "--trtfuse-cache",
        str(tmp_path / "engines"),
        "--trt-min-shapes",
        "input_ids:[1,1]",
        "--trt-opt-shapes",
        "input_ids:[1,4]",
        "--trt-max-shapes",
        "input_ids:[2,16]",
        "--builder-optimization-level",
        "2",
        "--pool-limit",
        "workspace:1G",
        "--fp16",
        "--gen",
        "-",
    )
    output = output_of(result)
    assert result.returncode == 0, output
    assert (
        "BuildTrtfuseEngine(fuse_with_trtfuse, presets=['decode'], "
        "profiles=[{'input_ids': [[1, 1], [1, 4], [2, 16]]}], "
        f"cache_dir={str(tmp_path / 'engines')!r}, optimization_level=2, workspace_bytes=1073741824)"
    ) in result.stdout
    assert "TrtfuseTrtRunner(build_trtfuse_engine)" in result.stdout
    assert "--fp16 does not apply to the --trtfuse engine" in output


def test_the_plugin_kind_of_the_trtfuse_engine_reaches_its_loader(tmp_path):
    result = polygraphy_run(
        str(FIXTURES / "qwen3-dynamo-fp32.onnx"), "--trtfuse", "--trtfuse-plugins", "python", "--gen", "-"
    )
    assert result.returncode == 0, output_of(result)
    assert "BuildTrtfuseEngine(fuse_with_trtfuse, plugins='python')" in result.stdout
    refused = polygraphy_run(str(FIXTURES / "qwen3-dynamo-fp32.onnx"), "--trtfuse", "--trtfuse-plugins", "cuda")
    assert refused.returncode != 0 and "invalid choice: 'cuda'" in output_of(refused)


def test_engine_profiles_are_compiles_or_polygraphys():
    model = load_model(FIXTURES / "qwen3-dynamo-fp32.onnx").model
    derived = engine_profiles_for(model, ["decode", "prefill"], [])
    assert derived == derive_profiles(model, request_from_options(presets=["decode", "prefill"]))
    (given,) = engine_profiles_for(model, ["decode"], [{"input_ids": [[1, 1], [1, 4], [2, 16]]}])
    assert given.name == "polygraphy 0"
    assert (given.shapes["input_ids"].min, given.shapes["input_ids"].opt, given.shapes["input_ids"].max) == (
        (1, 1),
        (1, 4),
        (2, 16),
    )


def test_bad_model_is_one_polygraphy_error_line(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    result = polygraphy_run(str(bad), "--trtfuse-onnxrt")
    output = output_of(result)
    assert result.returncode == 1, output
    errors = [line for line in output.splitlines() if line.startswith("[!]")]
    assert len(errors) == 1 and errors[0].startswith(f"[!] trtfuse: {bad}"), output
    assert "Traceback" not in output


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    output = output_of(result)
    assert result.returncode == 1, output
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.startswith("[!]")]
    return line


def test_a_fused_model_given_to_onnxrt_says_to_use_trtfuse_onnxrt(tmp_path):
    """Polygraphy's --onnxrt ended in onnxruntime's traceback (`TrtfuseRmsNorm(-1) is not a registered
    function/op`); the extension sees the plugin nodes first."""
    fused = tmp_path / "qwen3.fused.onnx"
    fuse_file(FIXTURES / "qwen3-dynamo-fp32.onnx", fused)
    line = _one_error_line(polygraphy_run(str(fused), "--onnxrt"))
    assert line.startswith(f"[!] trtfuse: {fused} holds 7 trtfuse plugin nodes, which --onnxrt cannot run")
    assert "use --trtfuse-onnxrt" in line
    assert polygraphy_run(str(fused), "--trtfuse-onnxrt").returncode == 0


def test_a_kv_cache_model_without_shapes_says_which_shapes_to_give():
    """Every dynamic dim 1 makes the attention mask 1 where past + new tokens are 2: onnxruntime's traceback from
    Polygraphy's runner. The line gives shapes that agree, and with them the run passes."""
    fixture = str(FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx")
    line = _one_error_line(polygraphy_run(fixture, "--onnxrt"))
    assert "the model needs dim 1 of input 'attention_mask' ('past_sequence_length + sequence_length') to be 2" in line
    shapes = line.split("e.g. --input-shapes ", 1)[1].split()
    assert shapes[:2] == ["input_ids:[2,1]", "attention_mask:[2,6]"]
    given = polygraphy_run(fixture, "--onnxrt", "--trtfuse-onnxrt", "--input-shapes", *shapes)
    assert given.returncode == 0, output_of(given)
    assert ALL_MATCHED in output_of(given)
    # A model all of whose dynamic dims may be 1 runs without shapes, as Polygraphy runs it.
    assert polygraphy_run(str(FIXTURES / "qwen3-dynamo-fp32.onnx"), "--onnxrt").returncode == 0


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_trtfuse_without_tensorrt_says_what_is_missing(tmp_path):
    result = polygraphy_run(
        str(FIXTURES / "qwen3-dynamo-fp32.onnx"), "--onnxrt", "--trtfuse", "--trtfuse-cache", str(tmp_path)
    )
    output = output_of(result)
    assert result.returncode == 1, output
    errors = [line for line in output.splitlines() if line.startswith("[!]")]
    assert len(errors) == 1, output
    assert "`tensorrt` is not installed" in errors[0] and "pip install" in errors[0]
    assert "Traceback" not in output
    assert not any(tmp_path.iterdir()), "nothing is written before TensorRT is found"


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TENSORRT, reason=NO_TENSORRT)
def test_trtfuse_engine_matches_the_original_and_is_reused(tmp_path):
    model = str(FIXTURES / "qwen3-dynamo-fp32.onnx")
    # TensorRT's fp32 kernels (TF32 off, as `trtfuse compile` builds) reorder sums: allow fp32 rounding of the logits.
    options = ("--onnxrt", "--trtfuse", "--trtfuse-cache", str(tmp_path), "--input-shapes", "input_ids:[1,8]")
    options += ("--atol", "1e-4", "--rtol", "1e-4")
    first = polygraphy_run(model, *options, cwd=tmp_path)
    assert first.returncode == 0, output_of(first)
    assert re.search(r"Accuracy Comparison \| onnxrt-runner-\S+ vs\. trtfuse-trt-runner-", output_of(first))
    assert ALL_MATCHED in output_of(first)
    engines = list(tmp_path.glob("*/model.engine"))
    assert len(engines) == 1 and engines[0].with_name("model.engine.json").is_file()
    again = polygraphy_run(model, *options, cwd=tmp_path)
    assert again.returncode == 0, output_of(again)
    assert f"using the engine built before: {engines[0]}" in output_of(again)


class _FakeTensorRT:
    __version__ = "10.99.0"


def _fake_build(calls: list):
    """Stands in for `pipeline.build_fused` where TensorRT is absent: records the call, writes an engine and its
    sidecar."""

    def build(fused, engine_path, options, notify):
        calls.append((fused.output_path, options))
        sidecar = make_sidecar(
            engine_path=engine_path,
            fused_model_path=fused.output_path,
            versions=tool_versions(_FakeTensorRT.__version__),
            gpu="fake GPU",
            plugins=[],
            profiles=options.profiles,
            build={**options.to_json(), "plugins": (options.plugins or PluginKind.PYTHON).value},
            shape_tensor_inputs=(),
        )
        write_engine_files(engine_path, b"engine", sidecar)
        return BuildResult(engine_path, sidecar_path_for(engine_path), sidecar, 0.0)

    return build


def test_engine_loader_builds_through_build_engine_once_then_reuses(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(loaders, "import_tensorrt", lambda: _FakeTensorRT)
    monkeypatch.setattr(loaders, "gpu_name", lambda: "fake GPU")
    monkeypatch.setattr(loaders, "build_fused", _fake_build(calls))
    fixture = FIXTURES / "qwen3-dynamo-fp32.onnx"
    build = loaders.BuildTrtfuseEngine(
        loaders.FuseModel(str(fixture)), presets=["decode", "prefill"], cache_dir=str(tmp_path), optimization_level=2
    )
    engine = Path(build())
    assert engine.is_file() and engine.parent.parent == tmp_path
    ((fused_path, options),) = calls
    assert fused_path == engine.with_name("model.fused.onnx") and fused_path.is_file()
    fused = load_model(fused_path).model
    assert sum(node.domain == contract.ONNX_DOMAIN for node in fused.graph.node) == 7
    assert list(options.profiles) == derive_profiles(fused, request_from_options(presets=["decode", "prefill"]))
    assert options.optimization_level == 2 and not options.allow_tf32
    assert json.loads(engine.with_name("model.fusion.json").read_text())["totals"]["norms"] == 9
    assert Path(build()) == engine and len(calls) == 1
    monkeypatch.setattr(loaders, "gpu_name", lambda: "another GPU")
    assert Path(build()) == engine and len(calls) == 2, "an engine from another GPU is built again"
    other = loaders.BuildTrtfuseEngine(loaders.FuseModel(str(fixture)), presets=["default"], cache_dir=str(tmp_path))
    assert Path(other()).parent != engine.parent, "other profiles, another engine"
    assert calls[-1][1].plugins is None, "no kind given: build_engine picks the installed TensorRT's default"
    python = loaders.BuildTrtfuseEngine(
        loaders.FuseModel(str(fixture)), presets=["decode", "prefill"], cache_dir=str(tmp_path), plugins="python"
    )
    assert Path(python()).parent != engine.parent, "another plugin kind, another engine"
    assert calls[-1][1].plugins is PluginKind.PYTHON


class _FakeTrtRunner:
    def __init__(self) -> None:
        self.profiles: list[int] = []

    def activate(self) -> None:
        pass

    def deactivate(self) -> None:
        pass

    def get_input_metadata(self, use_numpy_dtypes: bool) -> TensorMetadata:
        return TensorMetadata().add("input_ids", DataType.INT64, (1, None))

    def set_profile(self, index: int) -> None:
        self.profiles.append(index)

    def infer(self, feed):
        return {"echo": feed["input_ids"]}

    def last_inference_time(self) -> float:
        return 0.001


def _fake_sessions(monkeypatch, fake: _FakeTrtRunner) -> None:
    """Engine sessions over `fake` in place of Polygraphy's TrtRunner, TensorRT imported as nothing."""
    import polygraphy.backend.trt

    monkeypatch.setattr(session_module, "import_tensorrt", lambda: object())
    monkeypatch.setattr(polygraphy.backend.trt, "TrtRunner", lambda load, name, optimization_profile: fake)


def test_engine_runner_runs_each_feed_in_the_profile_that_holds_it(tmp_path, monkeypatch):
    fake = _FakeTrtRunner()
    decode = Profile("decode", {"input_ids": ShapeRange((1, 1), (1, 1), (1, 1))})
    prefill = Profile("prefill", {"input_ids": ShapeRange((1, 2), (1, 8), (1, 64))})
    _fake_sessions(monkeypatch, fake)
    with runners.TrtfuseTrtRunner(engine_in_memory(tmp_path / "model.engine", (decode, prefill))) as runner:
        assert runner.name.startswith("trtfuse-trt-runner-")
        for tokens in (1, 8, 8, 1):
            outputs = runner.infer({"input_ids": np.zeros((1, tokens), np.int64)})
            assert outputs["echo"].shape == (1, tokens)
        with pytest.raises(
            PolygraphyException, match="input 'input_ids' of shape 1x65 fits no optimisation profile"
        ) as raised:
            runner.infer({"input_ids": np.zeros((1, 65), np.int64)})
        assert isinstance(raised.value.__cause__, TrtfuseError), "trtfuse's commands raise the cause again"
    assert fake.profiles == [1, 0]


def test_every_engine_runs_through_the_one_engine_session(tmp_path, monkeypatch):
    """`run`, `compare`, the leak check and the Polygraphy runner: one session, one profile rule, one error line."""
    fake = _FakeTrtRunner()
    _fake_sessions(monkeypatch, fake)
    decode = Profile("decode", {"input_ids": ShapeRange((1, 1), (1, 1), (1, 1))})
    with EngineSession(engine_in_memory(tmp_path / "model.engine", (decode,))) as session:
        assert session.infer({"input_ids": np.ones((1, 1), np.int64)})["echo"].shape == (1, 1)
        with pytest.raises(TrtfuseError, match="input 'input_ids' of shape 1x2 fits no optimisation profile"):
            session.infer({"input_ids": np.ones((1, 2), np.int64)})


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_an_engine_session_without_tensorrt_says_what_is_missing(tmp_path):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine")
    with pytest.raises(MissingDependencyError, match="`tensorrt` is not installed"):
        EngineSession(EngineFile.open(engine)).__enter__()


def test_trtfuse_profiles_warn_of_a_decode_profile_without_a_cache(capsys):
    from polygraphy.logger import G_LOGGER

    model = onnx.load(str(FIXTURES / "llama-torchscript-fp16.onnx"))
    with G_LOGGER.verbosity(G_LOGGER.WARNING):
        profiles = engine_profiles_for(model, ["decode"], [])
    assert [profile.name for profile in profiles] == ["decode"]
    assert "trtfuse: profile 'decode': the model has no KV cache" in capsys.readouterr().out
