"""#13 part 8: the package has rooms (core, clients, ops, delta); the imports the README shows keep working."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
PUBLIC = {'dlq': 'retry_engine.clients.dlq', 'redrive': 'retry_engine.ops.redrive', 'resend': 'retry_engine.ops.resend', 'producer': 'retry_engine.clients.producer', 'consumer': 'retry_engine.clients.consumer', 'session': 'retry_engine.delta.session', 'cluster': 'retry_engine.ops.cluster', 'resolve': 'retry_engine.ops.resolve', 'redrive_tasks': 'retry_engine.ops.redrive_tasks'}


def readme_imports() -> list[str]:
    """Every ``from retry_engine... import ...`` line of the README's Python blocks."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return sorted({line.strip() for block in blocks for line in block.splitlines() if line.startswith("from retry_engine")})


def test_the_readme_shows_imports() -> None:
    assert len(readme_imports()) >= 5


@pytest.mark.parametrize("statement", readme_imports())
def test_every_readme_import_works(statement: str) -> None:
    exec(statement, {})


@pytest.mark.parametrize(("public", "home"), sorted(PUBLIC.items()))
def test_a_public_path_is_the_moved_module_itself(public: str, home: str) -> None:
    """The same module object, so a setting or a patch through either path is seen through the other."""
    assert importlib.import_module(f"retry_engine.{public}") is importlib.import_module(home)


def test_the_flat_folder_is_gone() -> None:
    package = README.parent / "retry_engine"
    top = sorted(p.stem for p in package.glob("*.py"))
    assert top == sorted(["__init__", "config", "errors", *PUBLIC])
    assert {p.name for p in package.iterdir() if (p / "__init__.py").exists()} == {"clients", "core", "delta", "ops"}
