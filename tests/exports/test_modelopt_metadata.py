"""`models/export_modelopt.py` copies the source export's metadata into what ModelOpt writes (ModelOpt drops it), so
a ModelOpt KV export keeps the positions its model was trained for and trtfuse warns past them as it does on the
source."""

from __future__ import annotations

import importlib.util

import onnx
import pytest

from trtfuse.model.dims import POSITIONS_METADATA_KEY, model_dims

from support.paths import FIXTURES, REPO_ROOT, TOOL_FIXTURES

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="the export scripts need torch and transformers (pip install -e '.[export]')",
)


def test_the_modelopt_export_keeps_the_source_exports_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "models"))
    from export_modelopt import copy_metadata

    # The committed FP8 fixture is what ModelOpt wrote, without metadata; the KV fixture is export.py --cache's.
    source = onnx.load(str(FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"))
    source.metadata_props.add(key="written_by", value="export.py")
    quantized = onnx.load(str(TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"))
    assert model_dims(quantized).declared_positions is None
    quantized.metadata_props.add(key="written_by", value="modelopt")

    copy_metadata(source, quantized)

    metadata = {entry.key: entry.value for entry in quantized.metadata_props}
    assert metadata == {"written_by": "modelopt", POSITIONS_METADATA_KEY: "128"}
    assert model_dims(quantized).declared_positions.value == 128
