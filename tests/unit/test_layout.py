"""The Lambda layer (template.yaml's ContentUri `shared/`) holds exactly what the functions
import: every module of it is reached from some handler, and nothing a handler reaches
lies outside it. The local stack's runtimes are entry points the layer loads by name: it
never imports the tools."""

from __future__ import annotations

import ast
import importlib
import sys
import sysconfig
from modulefinder import ModuleFinder
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "shared"
HANDLERS = sorted((ROOT / "functions").glob("*/app.py"))


def ours(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in {"seedkeeper", "seedkeeper_task", "seedkeeper_tools"}


def test_the_layer_is_exactly_what_the_functions_import() -> None:
    # The layer and the standard library only: third-party imports are not followed.
    finder = ModuleFinder(path=[str(LAYER), sysconfig.get_paths()["stdlib"]])
    for handler in HANDLERS:
        finder.run_script(str(handler))
    reached = {name for name in finder.modules if ours(name)}
    shipped = {
        ".".join(path.relative_to(LAYER).with_suffix("").parts).removesuffix(".__init__")
        for path in (LAYER / "seedkeeper").rglob("*.py")
    }
    assert len(HANDLERS) == 6
    assert shipped - reached == set(), "shipped in the layer, imported by no function"
    assert reached - shipped == set()
    # All the finder cannot resolve is a name imported from one of the layer's packages
    # (`from seedkeeper import __version__`), which is not a module.
    packages = {
        ".".join(path.parent.relative_to(LAYER).parts)
        for path in (LAYER / "seedkeeper").rglob("__init__.py")
    }
    for name in (name for name in finder.badmodules if ours(name)):
        package, _, attribute = name.rpartition(".")
        assert package in packages, name
        assert hasattr(importlib.import_module(package), attribute), f"no module {name}"


def test_the_layer_never_names_the_tools() -> None:
    """Not even in a lazy import or a comment: the local stack gives the layer its runtimes
    (entry points), so the layer works, and type-checks, without the tools installed."""
    named = [
        str(path.relative_to(ROOT))
        for path in LAYER.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and b"seedkeeper_tools" in path.read_bytes()
    ]
    assert named == []


def test_the_domain_is_pure() -> None:
    """Decisions and values import the standard library, pydantic and each other: no
    store, no adapter, no AWS SDK, so nothing in them can do I/O."""
    allowed = {"pydantic", "pydantic_settings"} | set(sys.stdlib_module_names)
    for path in (LAYER / "seedkeeper" / "domain").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.startswith("seedkeeper.domain") or name.split(".")[0] in allowed, (
                    f"{path.name} imports {name}"
                )
