"""The scaling study: every cell of models × tasks × budgets × algorithms × seeds, one MLflow
experiment under a study parent run, then the report.

Cells run one after another in this process (each a normal privzo run or search). A cell whose
directory holds a finished run of exactly its config is not run again, and an interrupted one
goes on from its own trajectory, as the same ``privzo run`` would, so a study resumes where it
stopped; ``max_cells`` bounds how many cells one invocation trains (a time-boxed job).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.audit import AuditRecord
from privzo.config.loading import dump_config
from privzo.config.run import RunConfig
from privzo.run import finished_run, refuse_other_run, run, starts_over
from privzo.rundir import (
    SUMMARY_FILE,
    RunSummary,
    read_summary,
    write_config,
    write_json_atomically,
    write_summary,
)
from privzo.section import ConfigError
from privzo.studies.audits import (
    AUDITS_DIR,
    audit_cell_names,
    check_audit_cell,
    finished_audit,
    run_audit_cell,
)
from privzo.studies.cells import Cell, check_cells, expand_cells
from privzo.studies.config import ScalingStudyConfig
from privzo.studies.summary import StudySummary
from privzo.tracking import (
    Tracker,
    connect_tracker,
    default_tracking_uri,
    make_tracker,
    ui_lines,
)
from privzo.tracking.tags import CELL, PARENT_RUN, ROLE, SEED, STUDY

STATE_FILE = "study_state.json"
CELLS_DIR = "cells"
REPORT_DIR = "report"


@dataclass
class StudyState:
    parent_run_id: str | None

    @classmethod
    def load(cls, path: Path) -> StudyState | None:
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, path: Path) -> None:
        write_json_atomically(path, {"parent_run_id": self.parent_run_id})


def run_scaling_study(
    study: ScalingStudyConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    tracking_uri: str | None = None,
    tracking_root: Path | None = None,
    max_cells: int | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> StudySummary:
    """Run (or resume) every cell, then build the report; returns the study summary.

    Without a tracking URI the MLflow store is sqlite under ``tracking_root`` (default
    ``output_dir``).
    """
    output_dir = Path(output_dir).resolve()
    tracking_root = Path(tracking_root or output_dir).resolve()
    if tracking_uri is None:
        tracking_uri = default_tracking_uri(tracking_root)
    cells = expand_cells(study)
    configs = check_cells(study, cells)  # every cell, before the first trains
    _check_cell_dirs(cells, configs, output_dir)
    audits = audit_cell_names(study, cells)
    _check_audit_cells(study, cells, configs, audits, output_dir)
    if study.search is not None:
        _check_search(study)
    tracker = _study_tracker(study, tracking_root, tracking_uri)
    output_dir.mkdir(parents=True, exist_ok=True)
    state = StudyState.load(output_dir / STATE_FILE)
    if state is not None and state.parent_run_id is not None:
        tracker.attach(state.parent_run_id)
    else:
        tracker.start()
        StudyState(tracker.run_id).save(output_dir / STATE_FILE)
        tracker.log_params(study.model_dump(mode="json"))
    options = {"cache_dir": cache_dir, "tracking_uri": tracking_uri, "progress": progress}
    with tracker:
        summaries, trained = _run_trained_cells(
            study, cells, configs, output_dir, tracking_root, tracker, max_cells, options, echo
        )
        records: dict[str, AuditRecord] = {}
        if len(summaries) == len(cells):  # the audit cells come after every trained cell
            left = None if max_cells is None else max_cells - trained
            records = _run_audit_cells(
                study, cells, configs, audits, output_dir, tracker, left, options, echo
            )
        done, total = len(summaries) + len(records), len(cells) + len(audits)
        complete = done == total
        summary = StudySummary(
            study=study.name,
            cells=len(cells),
            cells_finished=len(summaries),
            audit_cells=len(audits),
            audit_cells_finished=len(records),
            audits={name: record.brief() for name, record in records.items()},
            complete=complete,
            parent_run_id=tracker.run_id,
        )
        if complete:
            summary.report = _report(study, output_dir, tracker, tracking_uri, echo)
        else:
            echo(
                f"[study {study.name}] {done}/{total} cells finished; run the same command "
                "again to continue"
            )
    write_json_atomically(output_dir / "study_summary.json", summary.to_dict())
    return summary


def _run_trained_cells(
    study: ScalingStudyConfig,
    cells: list[Cell],
    configs: dict[str, RunConfig],
    output_dir: Path,
    tracking_root: Path,
    tracker: Tracker,
    max_cells: int | None,
    options: dict[str, Any],
    echo: Callable[[str], None],
) -> tuple[dict[str, RunSummary], int]:
    """Run (or reuse) the trained cells in order, at most ``max_cells`` new ones; their
    summaries and how many were trained now."""
    trained = 0
    summaries: dict[str, RunSummary] = {}
    for index, cell in enumerate(cells, start=1):
        cell_dir = output_dir / CELLS_DIR / cell.name
        done = finished_run(
            configs[cell.name],
            cell_dir,
            cache_dir=options["cache_dir"],
            tracking_root=tracking_root,
            tracking_uri=options["tracking_uri"],
        )
        if done is not None:
            summaries[cell.name] = done
            continue
        if max_cells is not None and trained >= max_cells:
            break
        echo(f"[study {study.name}] cell {index}/{len(cells)}: {cell.name}")
        summaries[cell.name] = _run_cell(
            study,
            cell,
            configs[cell.name],
            cell_dir,
            tracking_root,
            tracker,
            options["cache_dir"],
            options["tracking_uri"],
            options["progress"],
        )
        trained += 1
    return summaries, trained


def _check_cell_dirs(cells: list[Cell], configs: dict[str, RunConfig], output_dir: Path) -> None:
    """A cell whose directory holds another config's run (the study's base, overrides or
    experiment changed since it ran) is refused before any cell trains: its released steps are
    not written over."""
    advice = (
        "(the study's base, overrides or experiment changed since it ran); delete that "
        "directory to run the cell with this config, or choose another --output-dir"
    )
    for index, cell in enumerate(cells, start=1):
        named = f"study cell {index}/{len(cells)} {cell.name}: "
        refuse_other_run(output_dir / CELLS_DIR / cell.name, configs[cell.name], named, advice)


def _check_audit_cells(
    study: ScalingStudyConfig,
    cells: list[Cell],
    configs: dict[str, RunConfig],
    audits: dict[str, str],
    output_dir: Path,
) -> None:
    """What each audit cell's ``privzo audit`` would refuse, before any cell trains."""
    if study.audit is None:
        return
    settings = study.audit.settings()
    for index, (cell, name) in enumerate(audits.items(), start=1):
        cell_dir = output_dir / AUDITS_DIR / name
        if finished_audit(cell_dir, configs[cell], settings) is not None:
            continue
        try:
            check_audit_cell(configs[cell], settings, cell_dir)
        except (ValueError, OSError) as error:
            raise ConfigError(f"study audit cell {index}/{len(audits)} {name}: {error}") from None


def _run_audit_cells(
    study: ScalingStudyConfig,
    cells: list[Cell],
    configs: dict[str, RunConfig],
    audits: dict[str, str],
    output_dir: Path,
    tracker: Tracker,
    budget: int | None,
    options: dict[str, Any],
    echo: Callable[[str], None],
) -> dict[str, AuditRecord]:
    """Run (or reuse) the audit cells in order, at most ``budget`` new ones; their records."""
    if study.audit is None:
        return {}
    settings, ran = study.audit.settings(), 0
    records: dict[str, AuditRecord] = {}
    by_name = {cell.name: cell for cell in cells}
    for index, (cell_name, name) in enumerate(audits.items(), start=1):
        cell_dir = output_dir / AUDITS_DIR / name
        record = finished_audit(cell_dir, configs[cell_name], settings)
        if record is None:
            if budget is not None and ran >= budget:
                break
            echo(f"[study {study.name}] audit cell {index}/{len(audits)}: {name}")
            tags = {**_cell_tags(study, by_name[cell_name], tracker), CELL: name}
            record = run_audit_cell(configs[cell_name], settings, cell_dir, tags=tags, **options)
            ran += 1
        if record.violated:
            echo(f"[study {study.name}] PRIVACY VIOLATED in {name}: {record.brief().to_dict()}")
        records[name] = record
    return records


def _check_search(study: ScalingStudyConfig) -> None:
    from privzo.search import load_search_config

    assert study.search is not None
    load_search_config(study.search)


def _study_tracker(study: ScalingStudyConfig, tracking_root: Path, tracking_uri: str) -> Tracker:
    tracker = make_tracker(
        "mlflow",
        uri=tracking_uri,
        experiment=study.experiment or study.name,
        output_root=tracking_root,
        run_name=f"study-{study.name}",
        tags={ROLE: "study", STUDY: study.name},
        # the study's duration adds up its private cells' times
        release_timing=not study.private_algorithms,
    )
    return connect_tracker(tracker, tracking_uri)


def _cell_tags(study: ScalingStudyConfig, cell: Cell, tracker: Tracker) -> dict[str, str]:
    return {
        PARENT_RUN: str(tracker.run_id),
        STUDY: study.name,
        CELL: cell.name,
        SEED: str(cell.seed),
        "privzo.budget": f"{cell.epsilon:g}" if cell.epsilon is not None else "non-private",
    }


def _run_cell(
    study: ScalingStudyConfig,
    cell: Cell,
    config: RunConfig,
    cell_dir: Path,
    tracking_root: Path,
    tracker: Tracker,
    cache_dir: Path,
    tracking_uri: str,
    progress: bool,
) -> RunSummary:
    tags = _cell_tags(study, cell, tracker)
    if study.search is not None and cell.epsilon is not None:
        return _search_cell(study, config, cell_dir, tracking_root, tags, cache_dir, tracking_uri)
    return run(
        config,
        cell_dir,
        cache_dir=cache_dir,
        progress=progress,
        # an interrupted attempt goes on from its trajectory, into its MLflow run; one that
        # cannot (no trajectory) starts over; a finished cell was returned above
        overwrite=starts_over(config, cell_dir),
        tracking_root=tracking_root,
        tracking_uri=tracking_uri,
        tags=tags,
    )


def _search_cell(
    study: ScalingStudyConfig,
    config: RunConfig,
    cell_dir: Path,
    tracking_root: Path,
    tags: dict[str, str],
    cache_dir: Path,
    tracking_uri: str,
) -> RunSummary:
    """A private cell answered by a search: the best trial's run stands for the cell (tagged
    as the cell's run) and the search's end-to-end ε goes into the cell's summary."""
    from privzo.search import SearchConfig, load_search_config, run_search
    from privzo.tracking import set_run_tags

    assert study.search is not None
    cell_dir.mkdir(parents=True, exist_ok=True)
    base_file = cell_dir / "base.yaml"
    base_file.write_text(dump_config(config))
    search = load_search_config(study.search)
    data = search.model_dump(mode="json")
    data.update(base=[str(base_file)], overrides={}, experiment=config.tracking.experiment)
    summary = run_search(
        SearchConfig.model_validate(data),
        cell_dir / "search",
        cache_dir=cache_dir,
        tracking_uri=tracking_uri,
        tracking_root=tracking_root,
        tags={**tags, ROLE: "search"},
        progress=False,
    )
    best_dir = cell_dir / "search" / "trials" / str(summary.best_trial)
    result = read_summary(best_dir / SUMMARY_FILE)
    assert result is not None, "the best trial is a finished one"
    result.add(
        {
            "search_end_to_end_epsilon": summary.bounds.end_to_end_epsilon,
            "search_guarantee": summary.bounds.guarantee,
        }
    )
    assert result.tracking_run_id is not None, "a study's trials are tracked in its MLflow store"
    cell_tags = {k: v for k, v in tags.items() if k != PARENT_RUN}
    set_run_tags(tracking_uri, result.tracking_run_id, {**cell_tags, "privzo.search_best": "true"})
    write_summary(cell_dir / SUMMARY_FILE, result)
    write_config(cell_dir, config)
    return result


def _report(
    study: ScalingStudyConfig,
    output_dir: Path,
    tracker: Tracker,
    tracking_uri: str,
    echo: Callable[[str], None],
) -> str:
    from privzo.analysis import build_report

    report_dir = output_dir / REPORT_DIR
    experiment = study.experiment or study.name
    report = build_report(
        tracking_uri,
        experiment,
        report_dir,
        study=study.name,
        echo=echo,
        tracker=tracker,
        artifact_dir=REPORT_DIR,
    )
    lines = ui_lines(tracking_uri, [experiment])
    if lines:
        echo("\n".join(["MLflow, the study's runs side by side:", *lines]))
    return str(report)
