"""The Lambda layer (template.yaml's ContentUri `shared/`) holds exactly what the functions
import: every module of it is reached from some handler, and nothing a handler reaches
lies outside it, except the local runtime that configuration chooses off Lambda."""

from __future__ import annotations

import ast
import sys
import sysconfig
from modulefinder import ModuleFinder
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "shared"
HANDLERS = sorted((ROOT / "functions").glob("*/app.py"))
# What the finder cannot resolve in the layer alone: the local stack's runtimes, which
# `runtime_from` imports only when SEEDKEEPER_RUNTIME is docker or local, and a name
# imported from a package (`from seedkeeper import __version__`), which is not a module.
UNRESOLVED = {
    "seedkeeper_tools.local.docker",
    "seedkeeper_tools.local.runtime",
    "seedkeeper.__version__",
}


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
    assert {name for name in finder.badmodules if ours(name)} == UNRESOLVED


def test_the_domain_is_pure() -> None:
    """Decisions and values import the standard library, pydantic and each other: no
    store, no adapter, no AWS SDK, so nothing in them can do I/O."""
    allowed = {"pydantic", "pydantic_settings"} | set(sys.stdlib_module_names)
    for path in (LAYER / "seedkeeper" / "domain").glob("*.py"):
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
