"""The scripts in models/ without the export extra: one line naming the missing module and the extra, exit 3 (a
missing optional dependency), never a ModuleNotFoundError traceback; `-h` included."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.paths import REPO_ROOT

# The module made unimportable, as on a machine where `pip install -e .` ran without `.[export]`.
WITHOUT = """
import runpy, sys
sys.modules[{module!r}] = None
sys.path.insert(0, "models")
sys.argv = [{script!r}, "-h"]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("script", "module"),
    [
        ("models/export.py", "torch"),
        ("models/export.py", "transformers"),
        ("models/export_optimum.py", "torch"),
        ("models/export_genai.py", "torch"),
        ("models/export_onnxslim.py", "torch"),
        ("models/export_modelopt.py", "torch"),
        ("models/export_dynamo23.py", "torch"),
        ("models/verify_exports.py", "transformers"),
    ],
)
def test_an_export_script_without_the_export_extra_says_which_to_install(script: str, module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT.format(module=module, script=script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.splitlines()
    name = script.rsplit("/", 1)[-1]
    assert line.startswith(f"{name}: error: {module} is not installed; install trtfuse's export extra: ")
    assert "pip install -e '.[export]'" in line
    assert result.stdout == ""
