"""Where the tests find the checkout: its root, the package and the committed model fixtures."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO_ROOT / "trtfuse"
FIXTURES = REPO_ROOT / "models" / "fixtures"
TOOL_FIXTURES = FIXTURES / "tools"
