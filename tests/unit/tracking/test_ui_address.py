"""The addresses privzo prints for ``mlflow ui`` ask for views the installed UI knows."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import mlflow

from privzo.tracking import get_or_create_experiment, open_client, ui_address, ui_lines
from privzo.tracking.store import CLASSIC_VIEW_QUERY, RUNS_BY_NAME_QUERY


def _bundle() -> str:
    folder = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    return " ".join(path.read_text(errors="ignore") for path in folder.glob("*.js"))


def test_the_installed_ui_reads_the_classic_view_and_the_run_name_order() -> None:
    """MLflow 3.17's UI takes its view from the address's ``workflowType`` (else GenAI) and its
    runs table's order from ``orderByKey``, whose run-name key it spells as the address does."""
    scripts = _bundle()
    key, value = CLASSIC_VIEW_QUERY.split("=")
    assert f'"{key}"' in scripts and f'="{value}"' in scripts
    order = dict(part.split("=") for part in RUNS_BY_NAME_QUERY.split("&"))
    assert '"orderByKey","orderByAsc"' in scripts
    assert f'RUN_NAME:"{unquote(order["orderByKey"])}"' in scripts
    assert ui_address("http://h:1") == f"http://h:1/#/experiments?{CLASSIC_VIEW_QUERY}"
    assert ui_address("http://h:1", "7") == (
        f"http://h:1/#/experiments/7/runs?{CLASSIC_VIEW_QUERY}&{RUNS_BY_NAME_QUERY}"
    )


def test_ui_lines_give_the_command_and_each_existing_experiments_runs(tmp_path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = get_or_create_experiment(open_client(uri), "e", None)
    command, *addresses = ui_lines(uri, ["e", "missing"])
    assert command == f"mlflow ui --backend-store-uri {uri}"
    assert addresses == [f"  e: {ui_address(experiment_id=experiment)}"]
    assert ui_lines("databricks", ["e"]) == []
