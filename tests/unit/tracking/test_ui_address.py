"""The address privzo prints for ``mlflow ui`` asks for a view the installed UI knows."""

from __future__ import annotations

from pathlib import Path

import mlflow

from privzo.tracking.store import CLASSIC_VIEW_QUERY, ui_address


def test_the_installed_ui_reads_the_classic_view_query() -> None:
    """MLflow 3.17's UI takes its view from the address's ``workflowType`` (else GenAI)."""
    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    scripts = " ".join(path.read_text(errors="ignore") for path in bundle.glob("main.*.js"))
    key, value = CLASSIC_VIEW_QUERY.split("=")
    assert f'"{key}"' in scripts and f'="{value}"' in scripts
    assert ui_address("http://h:1") == f"http://h:1/#/experiments?{CLASSIC_VIEW_QUERY}"
