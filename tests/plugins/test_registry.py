"""TensorRT's plugin registry as trtfuse uses it: which TensorRT builds the AOT plugins, one plugin kind per process,
and what needs no TensorRT to import."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from trtfuse.contract import PluginKind
from trtfuse.errors import TrtfuseError
from trtfuse.plugins import registry

from support.markers import HAS_TENSORRT, HAS_TENSORRT_RTX
from support.paths import REPO_ROOT

ROOT = REPO_ROOT


def test_one_process_registers_one_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_claimed_kind", None)
    registry.claim_plugin_kind(PluginKind.AOT)
    registry.claim_plugin_kind(PluginKind.AOT)
    with pytest.raises(TrtfuseError) as raised:
        registry.claim_plugin_kind(PluginKind.PYTHON)
    assert "\n" not in str(raised.value) and "registered trtfuse's aot plugins" in str(raised.value)
    monkeypatch.setattr(registry, "_claimed_kind", None)
    registry.claim_plugin_kind(PluginKind.PYTHON)
    with pytest.raises(TrtfuseError, match="registered trtfuse's python plugins"):
        registry.claim_plugin_kind(PluginKind.AOT)
    with pytest.raises(ValueError):
        registry.claim_plugin_kind("jit")


def test_importing_the_aot_modules_needs_neither_tensorrt_nor_cutedsl() -> None:
    code = (
        "import sys, trtfuse.plugins.qdp, trtfuse.fusion.aot_form\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'tensorrt_rtx', 'cutlass')"
        " or m.startswith('trtfuse.kernels')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.skipif(
    not HAS_TENSORRT_RTX or HAS_TENSORRT,
    reason="needs TensorRT-RTX's module (a TensorRT without AOT plugins) where `tensorrt` is absent",
)
def test_register_aot_refuses_a_tensorrt_without_aot_in_one_line() -> None:
    code = (
        "from trtfuse.errors import MissingDependencyError\n"
        "from trtfuse.plugins import registry\n"
        "try:\n    registry.register_aot()\nexcept MissingDependencyError as error:\n    print(error)\n"
        "else:\n    raise SystemExit('registered')\n"
        "assert registry._claimed_kind is None\n"
    )
    env = {**os.environ, "TRTFUSE_TRT_MODULE": "tensorrt_rtx"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert "has no AOT plugins (tensorrt.plugin's aot_impl); trtfuse builds AOT plugins with TensorRT >= 10.14" in line


@pytest.mark.parametrize(
    ("version", "has_request", "supported"),
    [
        ("10.8.0.43", False, False),
        ("10.9.0.34", True, False),  # AOT QDPs exist, but its parser may look them up by node name (registry.py)
        ("10.10.0.31", True, False),  # 10.10-10.13: the binding hands TensorRT a freed kernel name (registry.py)
        ("10.13.3.9", True, False),
        ("10.14.1.48", True, True),
        ("11.1.0.4", True, True),
        ("11.1.0.4", False, False),  # a build without tensorrt.plugin's AOT support (TensorRT-RTX 1.7 is one)
        ("unknown", True, False),
    ],
)
def test_aot_needs_the_aot_request_type_and_tensorrt_10_14(version: str, has_request: bool, supported: bool) -> None:
    fields = {"__version__": version} | ({"QuickPluginCreationRequest": object} if has_request else {})
    assert registry.aot_supported(SimpleNamespace(**fields)) is supported
