"""The test tree's own rules: every module under tests/integration is marked, so the fast suite
(`python -m pytest`, which deselects the marks) never runs an end-to-end test unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

INTEGRATION = REPO / "tests" / "integration"


def module_marks(path: Path) -> set[str]:
    """The marker names in a module's top-level ``pytestmark`` (one mark or a list of them)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            return {
                mark.attr
                for mark in ast.walk(node.value)
                if isinstance(mark, ast.Attribute) and isinstance(mark.value, ast.Attribute)
            }
    return set()


def test_every_integration_module_is_marked_integration():
    modules = sorted(INTEGRATION.glob("test_*.py"))
    assert len(modules) >= 5, "the integration tests were not found where expected"
    unmarked = [path.name for path in modules if "integration" not in module_marks(path)]
    assert unmarked == [], f"add `pytestmark = pytest.mark.integration` to {unmarked}"


def test_the_mark_reader_sees_one_mark_a_list_and_none(tmp_path):
    (tmp_path / "one.py").write_text("import pytest\npytestmark = pytest.mark.integration\n")
    listed = "import pytest\npytestmark = [pytest.mark.ray, pytest.mark.integration]\n"
    (tmp_path / "listed.py").write_text(listed)
    marked_test = "import pytest\n\n@pytest.mark.integration\ndef test(): pass\n"
    (tmp_path / "none.py").write_text(marked_test)
    assert module_marks(tmp_path / "one.py") == {"integration"}
    assert module_marks(tmp_path / "listed.py") == {"ray", "integration"}
    assert module_marks(tmp_path / "none.py") == set()
