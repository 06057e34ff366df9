"""The package's import graph, read with `ast` from the source files (nothing is imported or executed).

The rules of docs/architecture.md checked here:
- no runtime module (anything under trtfuse/ outside trtfuse/bench/ and trtfuse/cli/) imports torch at module top:
  torch is for the harnesses, and a runtime module may import it only inside the function that needs it;
- the imports among trtfuse's modules form no cycle: neither the imports Python runs when a module is imported, nor
  all imports, function-level ones included (a cycle there is still two modules that each need the other), leaving
  out only a submodule's imports of its own package, which Python initialises before the submodule anyway;
- running and comparing an engine stand beside building it: the engine session, run, compare, the leak check and
  Polygraphy's engine runner import nothing from the build;
- every module's stage is the folder (or top-level module) of trtfuse/ it lies in, and no module imports, anywhere in
  the file, from a later stage of `STAGES`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import PACKAGE_ROOT

HARNESS_PACKAGES = ("trtfuse.bench", "trtfuse.cli")
FORBIDDEN_AT_TOP = "torch"
# The pipeline in import order, one entry per folder (or top-level module) of trtfuse/: a module may import from its
# own stage and earlier ones. The kernels and plugins stand beside the ONNX stages (they import none of them); the
# engine stage builds, holds and runs engines; generation drives a model or an engine token by token; the pipeline,
# the Polygraphy extension, the harnesses and the CLI are the faces over all of it.
STAGES: tuple[str, ...] = (
    "errors",
    "files",
    "contract",
    "model",
    "fusion",
    "verify",
    "kernels",
    "plugins",
    "engine",
    "generate",
    "pipeline",
    "polygraphy_ext",
    "bench",
    "cli",
)
# Module -> the modules it must not import from, anywhere in the file: running and comparing an engine stand beside
# building it.
SEPARATED = {
    "trtfuse.engine.session": ("trtfuse.engine.build",),
    "trtfuse.engine.run": ("trtfuse.engine.build",),
    "trtfuse.engine.compare": ("trtfuse.engine.build",),
    "trtfuse.engine.leak_check": ("trtfuse.engine.build",),
    "trtfuse.polygraphy_ext.runners": ("trtfuse.engine.build",),
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def top_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: the module body, its class bodies and its if / try / with
    blocks, not function bodies nor `if TYPE_CHECKING:` blocks."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement
        elif isinstance(statement, ast.If):
            pending.extend(statement.orelse if _is_type_checking(statement.test) else statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            pending.extend(statement.body + statement.orelse + statement.finalbody)
            pending.extend(line for handler in statement.handlers for line in handler.body)
        elif isinstance(statement, ast.With | ast.ClassDef):
            pending.extend(statement.body)


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement binds from: `from a import b` gives `a.b` (a submodule, or a name of a)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module `name` refers to: itself, or the longest module prefix (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path], module_top_only: bool) -> dict[str, set[str]]:
    """Module -> the package modules it imports: at module top only (what importing it runs), or anywhere in the file
    except its own ancestor packages."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        if module_top_only:
            imports = list(top_level_imports(tree))
        else:
            imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
        targets = {resolve(name, modules) for node in imports for name in imported_names(node, module, _is_pkg(path))}
        graph[module] = {
            target
            for target in targets
            if target is not None and target != module and (module_top_only or not module.startswith(f"{target}."))
        }
    return graph


def _is_pkg(path: Path) -> bool:
    return path.name == "__init__.py"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None (depth-first, children in name order)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, children = [start], [iter(sorted(graph[start]))]
        while path:
            child = next(children[-1], None)
            if child is None:
                done.add(path.pop())
                children.pop()
            elif child in path:
                return [*path[path.index(child) :], child]
            elif child not in done and child in graph:
                path.append(child)
                children.append(iter(sorted(graph[child])))
    return None


def is_runtime(module: str) -> bool:
    return not any(module == harness or module.startswith(f"{harness}.") for harness in HARNESS_PACKAGES)


def torch_at_module_top(modules: dict[str, Path]) -> list[str]:
    """'module: line N imports torch' for each runtime module that imports torch when it is imported."""
    found = []
    for module, path in modules.items():
        if not is_runtime(module):
            continue
        for node in top_level_imports(ast.parse(path.read_text(), str(path))):
            for name in imported_names(node, module, _is_pkg(path)):
                if name == FORBIDDEN_AT_TOP or name.startswith(f"{FORBIDDEN_AT_TOP}."):
                    found.append(f"{module}: line {node.lineno} imports {name}")
    return sorted(found)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(f"{prefix}.")


def stage_of(module: str, stages: tuple[str, ...] = STAGES) -> int | None:
    """The index of the stage of `module`: the folder or top-level module of trtfuse/ it lies in (the package
    `trtfuse` itself, its version, comes first); None for one no stage names."""
    parts = module.split(".")
    if parts == ["trtfuse"]:
        return -1
    return stages.index(parts[1]) if parts[1] in stages else None


def later_stage_imports(graph: dict[str, set[str]], stages: tuple[str, ...] = STAGES) -> list[str]:
    """'module (stage) imports target (later stage)' for each import against the stage order, and 'module has no
    stage' for a module in no folder that `stages` names."""
    found = []
    for module, targets in graph.items():
        own = stage_of(module, stages)
        if own is None:
            found.append(f"{module} has no stage")
            continue
        for target in sorted(targets):
            other = stage_of(target, stages)
            if other is not None and other > own:
                found.append(f"{module} ({stages[own]}) imports {target} ({stages[other]})")
    return sorted(found)


def separated_imports(graph: dict[str, set[str]], separated: dict[str, tuple[str, ...]] = SEPARATED) -> list[str]:
    """'module imports target' for each import `separated` forbids."""
    return sorted(
        f"{module} imports {target}"
        for module, forbidden in separated.items()
        for target in graph.get(module, set())
        if any(_within(target, prefix) for prefix in forbidden)
    )


def test_the_package_is_read() -> None:
    modules = package_modules()
    assert {"trtfuse.contract", "trtfuse.plugins.python.base", "trtfuse.bench.kernels"} <= modules.keys()
    assert "trtfuse.kernels.api" in import_graph(modules, module_top_only=True)["trtfuse.bench.kernels"]
    assert "trtfuse.plugins.python.creators" in import_graph(modules, module_top_only=False)["trtfuse.plugins.registry"]


def test_no_runtime_module_imports_torch_at_module_top() -> None:
    assert torch_at_module_top(package_modules()) == []


@pytest.mark.parametrize("module_top_only", [True, False], ids=["at-import", "anywhere"])
def test_the_trtfuse_modules_import_one_another_without_a_cycle(module_top_only: bool) -> None:
    assert find_cycle(import_graph(package_modules(), module_top_only)) is None


def test_run_and_compare_import_nothing_from_build_or_check() -> None:
    graph = import_graph(package_modules(), module_top_only=False)
    assert SEPARATED.keys() <= graph.keys()
    assert separated_imports(graph) == []


def test_no_module_imports_from_a_later_stage() -> None:
    assert later_stage_imports(import_graph(package_modules(), module_top_only=False)) == []


# --- the checks themselves, on a throwaway package ----------------------------------------------------------------


def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / "trtfuse" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package_modules(root / "trtfuse")


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("import torch\n", 1),
        ("import os\nimport torch.nn.functional as F\n", 2),
        ("from torch import nn\n", 1),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", 2),
        ("class Kernel:\n    import torch\n", 2),
        ("def launch():\n    import torch\n", None),
        ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import torch\n", None),
        ("import torchlike\n", None),
    ],
)
def test_torch_check_sees_module_top_imports_in_runtime_modules_only(
    tmp_path: Path, source: str, line: int | None
) -> None:
    modules = write_package(tmp_path, {"__init__.py": "", "stage.py": source, "bench/__init__.py": source})
    found = torch_at_module_top(modules)
    if line is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(f"trtfuse.stage: line {line} imports torch"), found


def test_cycle_check_finds_absolute_relative_and_function_level_cycles(tmp_path: Path) -> None:
    acyclic = write_package(
        tmp_path / "ok",
        {"__init__.py": "", "a.py": "from trtfuse import b\n", "b.py": "from trtfuse.c import value\n", "c.py": ""},
    )
    assert find_cycle(import_graph(acyclic, module_top_only=False)) is None
    cyclic = write_package(
        tmp_path / "bad",
        {
            "__init__.py": "",
            "a.py": "from trtfuse import b\n",
            "b.py": "from .c import value\n",
            "c.py": "def late():\n    import trtfuse.a\n",
        },
    )
    assert find_cycle(import_graph(cyclic, module_top_only=False)) == [
        "trtfuse.a",
        "trtfuse.b",
        "trtfuse.c",
        "trtfuse.a",
    ]
    assert find_cycle(import_graph(cyclic, module_top_only=True)) is None
    package_cycle = write_package(
        tmp_path / "package",
        {"__init__.py": "from trtfuse.a import run\n", "a.py": "from trtfuse import helper\n"},
    )
    assert find_cycle(import_graph(package_cycle, module_top_only=True)) == ["trtfuse", "trtfuse.a", "trtfuse"]
    assert find_cycle(import_graph(package_cycle, module_top_only=False)) is None


TOY_STAGES = ("model", "verify", "cli")


def test_stage_check_finds_imports_from_a_later_stage_and_unplaced_modules(tmp_path: Path) -> None:
    ordered = write_package(
        tmp_path / "ok",
        {
            "__init__.py": "",
            "model/__init__.py": "",
            "model/onnx_file.py": "",
            "verify/check.py": "from trtfuse.model import onnx_file\n",
            "cli/main.py": "import trtfuse.verify.check\n",
        },
    )
    assert later_stage_imports(import_graph(ordered, module_top_only=False), TOY_STAGES) == []
    backwards = write_package(
        tmp_path / "bad",
        {
            "__init__.py": "",
            "model/onnx_file.py": "def late():\n    from trtfuse.cli.main import cli\n",
            "verify/check.py": "",
            "cli/main.py": "",
            "extra.py": "",
        },
    )
    assert later_stage_imports(import_graph(backwards, module_top_only=False), TOY_STAGES) == [
        "trtfuse.extra has no stage",
        "trtfuse.model.onnx_file (model) imports trtfuse.cli.main (cli)",
    ]


def test_every_folder_and_top_level_module_of_the_package_is_a_stage() -> None:
    entries = {path.stem for path in PACKAGE_ROOT.iterdir() if path.suffix == ".py" or (path / "__init__.py").exists()}
    assert entries - {"__init__"} == set(STAGES)


def test_separation_check_finds_a_forbidden_import_anywhere_in_the_file(tmp_path: Path) -> None:
    modules = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "engine/build.py": "def import_tensorrt():\n    pass\n",
            "engine/run.py": "def load():\n    from trtfuse.engine.build import import_tensorrt\n",
            "engine/compare.py": "from trtfuse.engine import build\n",
            "engine/session.py": "from trtfuse.engine import run\n",
        },
    )
    assert separated_imports(import_graph(modules, module_top_only=False)) == [
        "trtfuse.engine.compare imports trtfuse.engine.build",
        "trtfuse.engine.run imports trtfuse.engine.build",
    ]


# What a CLI module may not import (outside `if TYPE_CHECKING:`): the stages' internals. A command reaches them
# through trtfuse.pipeline or a stage's own entry function, so the CLI holds no pipeline logic (issue 8).
CLI_PACKAGE = "trtfuse.cli"
CLI_FORBIDDEN = (
    "trtfuse.fusion.patterns",
    "trtfuse.fusion.rewrite",
    "trtfuse.fusion.lowering",
    "trtfuse.engine.build",
    "trtfuse.plugins",
    "trtfuse.kernels",
    "trtfuse.model.dims",
)


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of the file, function-level ones included, except those under `if TYPE_CHECKING:`."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def cli_internal_imports(modules: dict[str, Path]) -> list[str]:
    """`module imports target` for each CLI module that imports a stage internal of CLI_FORBIDDEN."""
    found = []
    for module, path in modules.items():
        if module != CLI_PACKAGE and not module.startswith(f"{CLI_PACKAGE}."):
            continue
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            for name in imported_names(node, module, _is_pkg(path)):
                target = resolve(name, modules)
                if target is not None and any(target == f or target.startswith(f"{f}.") for f in CLI_FORBIDDEN):
                    found.append(f"{module} imports {target}")
    return sorted(set(found))


def test_the_cli_imports_no_stage_internals() -> None:
    assert cli_internal_imports(package_modules()) == []


def test_the_cli_check_sees_function_level_imports_but_not_type_checking_ones(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "engine/build.py": "",
        "pipeline.py": "",
        "fusion/patterns/__init__.py": "",
        "cli/__init__.py": "",
        "cli/ok.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trtfuse.fusion.patterns import M\n"
        "def run():\n    from trtfuse.pipeline import compile_model\n",
        "cli/bad.py": "def run():\n    from trtfuse.engine.build import build_engine\n",
    }
    assert cli_internal_imports(write_package(tmp_path, files)) == ["trtfuse.cli.bad imports trtfuse.engine.build"]
