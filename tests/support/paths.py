"""Where the tests find the checkout: its root, the package and the committed model fixtures."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO_ROOT / "trtfuse"
FIXTURES = REPO_ROOT / "models" / "fixtures"
TOOL_FIXTURES = FIXTURES / "tools"


def fixture_models(folder: Path, pattern: str = "*.onnx") -> list[Path]:
    """The committed models under `folder` matching `pattern`: every match but trtfuse's own outputs, which a user
    may leave there (`trtfuse compile MODEL` without -o writes NAME.fused.onnx beside its input; .gitignore holds
    them)."""
    return sorted(path for path in folder.glob(pattern) if not path.name.endswith(".fused.onnx"))
