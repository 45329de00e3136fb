"""Dependencies point one way, file by file: the toolkit reaches the engine only through `reference_engine.api`
and only from the commands that run it; the engine core imports nothing from the rest of the engine; the engine
knows the toolkit only by its semantic conventions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (lazily)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _files(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def _module_imports(package: str, prefix: str) -> dict[str, set[str]]:
    found = {}
    for path in _files(package):
        hits = {name for name in _imports(path) if name == prefix or name.startswith(prefix + ".")}
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def test_the_toolkit_reaches_the_engine_only_through_its_facade_and_only_from_the_cli_and_the_demo() -> None:
    allowed_files = {"infertrace/demo.py"} | {str(p.relative_to(ROOT)) for p in _files("infertrace/cli")}
    offenders = {}
    for path, names in _module_imports("infertrace", "reference_engine").items():
        # `from reference_engine import api` names the package too; its __init__ is a docstring
        outside = {n for n in names if n not in ("reference_engine", "reference_engine.api")
                   and not n.startswith("reference_engine.api.")}
        if outside or path not in allowed_files:
            offenders[path] = sorted(names)
    assert not offenders, f"toolkit files importing the engine other than through reference_engine.api: {offenders}"


def test_the_dashboard_never_imports_the_engine() -> None:
    assert _module_imports("dashboards", "reference_engine") == {}


def test_the_engine_core_imports_nothing_from_the_rest_of_the_engine_or_the_toolkit() -> None:
    offenders = {}
    for path in _files("reference_engine/engine"):
        names = {n for n in _imports(path) if n.startswith(("reference_engine", "infertrace"))}
        outside = {n for n in names if not n.startswith("reference_engine.engine")}
        if outside:
            offenders[str(path.relative_to(ROOT))] = sorted(outside)
    assert not offenders, f"engine core files importing outside reference_engine/engine: {offenders}"


def test_the_engine_knows_the_toolkit_only_by_its_semantic_conventions() -> None:
    offenders = {path: sorted(outside) for path, names in _module_imports("reference_engine", "infertrace").items()
                 if (outside := names - {"infertrace", "infertrace.semconv"})}
    assert not offenders, f"engine files importing toolkit modules other than infertrace.semconv: {offenders}"


def test_the_compute_modules_import_no_cycle_between_the_transformer_and_the_kv_cache() -> None:
    kv_cache = _imports(ROOT / "reference_engine/compute/kv_cache.py")
    assert "reference_engine.compute.transformer" not in kv_cache
