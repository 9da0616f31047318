"""The layering: codegen never imports the runtime, and no runtime module imports the demo
(except the CLI that runs it)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    package = {"codegen": "kvforge.codegen", "runtime": "kvforge.runtime"}[path.parent.name]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_no_codegen_module_imports_the_runtime():
    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("kvforge.runtime"))
                 for p in sorted((REPO / "codegen").glob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_cli_imports_the_demo():
    users = [p.name for p in sorted((REPO / "runtime").glob("*.py"))
             if p.name not in ("demo.py", "cli.py") and any(m.startswith("kvforge.runtime.demo") for m in _imports(p))]
    assert users == []


def test_the_kvforge_command_is_the_runtime_cli():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"kvforge": "kvforge.runtime.cli:main"}


def test_runtime_select_still_exports_the_codegen_choice():
    from kvforge.codegen import select as codegen_select
    from kvforge.runtime.select import select_cdna_config, select_decode_config

    assert select_decode_config is codegen_select.select_decode_config
    assert select_cdna_config is codegen_select.select_cdna_config
