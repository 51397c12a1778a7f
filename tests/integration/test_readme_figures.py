"""The measurements page's demo arms table against a fresh run of the arms (`privzo demo`).

Zero-shot and MeZO repeat exactly on one platform, so they are compared exactly where torch's
version and CPU capability are the ones docs/measurements.md names, and within the cross-platform
spread it states elsewhere. DPZero draws fresh noise: it must land in the page's stated range.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import REPO
from privzo.cli import main

pytestmark = pytest.mark.integration

MEASUREMENTS = REPO / "docs" / "measurements.md"
MARKER = "<!-- demo-arms: checked by tests/integration/test_readme_figures.py -->"
ROWS = ("zero-shot", "DPZero (private)", "MeZO (non-private)")
CROSS_PLATFORM_SPREAD = 0.10  # docs/measurements.md: "within ±0.10 elsewhere"
DPZERO_RANGE = (0.70, 0.95)  # docs/measurements.md: "DPZero within 0.70 to 0.95"


def accuracies(table: str) -> dict[str, float]:
    """Each arm's test accuracy from the arms table as the demo prints it."""
    found = {}
    for row in ROWS:
        match = re.search(rf"^{re.escape(row)}\s+([0-9.]+)\s", table, flags=re.MULTILINE)
        assert match is not None, f"no {row!r} row in:\n{table}"
        found[row] = float(match.group(1))
    return found


def readme_platform() -> tuple[str, str]:
    """The torch version and CPU capability the arms table was measured with."""
    text = MEASUREMENTS.read_text()
    match = re.search(r"torch (\S+), CPU capability (\w+)", text)
    assert match is not None, "docs/measurements.md names the platform of its demo figures"
    return match.group(1), match.group(2)


def readme_table() -> str:
    text = MEASUREMENTS.read_text()
    assert MARKER in text, "the measurements page's arms table is marked for this test"
    block = text.split(MARKER, 1)[1].split("```", 2)[1]
    return block


def test_readme_names_the_platform_and_its_table_parses():
    version, capability = readme_platform()
    assert version.startswith("2.") and capability
    figures = accuracies(readme_table())
    assert DPZERO_RANGE[0] <= figures["DPZero (private)"] <= DPZERO_RANGE[1]


@pytest.mark.slow
def test_the_readme_arms_table_matches_a_fresh_run(tmp_path, capsys, cache_dir):
    expected = accuracies(readme_table())
    assert main(["demo", "--arms-only", "--output-dir", str(tmp_path / "demo"),
                 "--cache-dir", str(cache_dir)]) == 0  # fmt: skip
    measured = accuracies(capsys.readouterr().out)
    same_platform = readme_platform() == (
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),
    )
    tolerance = 0.0 if same_platform else CROSS_PLATFORM_SPREAD
    for row in ("zero-shot", "MeZO (non-private)"):
        assert measured[row] == pytest.approx(expected[row], abs=tolerance + 1e-9), row
    assert DPZERO_RANGE[0] <= measured["DPZero (private)"] <= DPZERO_RANGE[1]
