"""A study's audit cells: selected cells trained again with canaries and audited
(``privzo audit``), in ``DIR/audits/<cell>-audit/``, after the study's trained cells.

An audit cell is finished when its directory holds ``audit.json`` from exactly its run config
and audit settings; the same command does not run it again. An unfinished one goes on as
``privzo audit`` does: its run from its own trajectory, with the canaries and secret coins kept
in the cell's directory (``privzo.audit.draw``), or scored from its finished run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from privzo.audit import AUDIT_FILE, AuditRecord, check_audit, run_audit
from privzo.audit.canaries import check_canary_count
from privzo.audit.config import AuditConfig
from privzo.audit.draw import draw_digest, load_draw
from privzo.audit.record import RUN_DIR
from privzo.audit.training import check_audit_resumes
from privzo.config.loading import dump_config
from privzo.config.run import RunConfig
from privzo.models.loading import check_model
from privzo.run import refuse_other_run
from privzo.rundir import (
    CONFIG_FILE,
    finished_record,
    read_json_object,
    write_text_atomically,
)
from privzo.studies.config import ScalingStudyConfig
from privzo.tasks import load_splits, resolve_task_config

AUDITS_DIR = "audits"
SETTINGS_FILE = "study_audit.yaml"  # the audit settings of a finished audit cell
AUDIT_SUFFIX = "-audit"


def audit_cell_names(study: ScalingStudyConfig, cells: list[Any]) -> dict[str, str]:
    """Trained cell name → its audit cell's name, for the cells the study's audit selects."""
    audit = study.audit
    if audit is None:
        return {}
    return {
        cell.name: cell.name + AUDIT_SUFFIX
        for cell in cells
        if audit.selects(cell.model, cell.algorithm, cell.epsilon)
    }


def check_audit_cell(config: RunConfig, audit: AuditConfig, cell_dir: Path) -> None:
    """What ``privzo audit`` refuses before training: the layout, the task, k against M, M
    against the cell's private training rows, and a stopped attempt without its draw."""
    check_audit(config, audit, cell_dir, overwrite=True)  # an audit.json: see run_audit_cell
    advice = (
        "(the study's base, overrides or experiment changed since it ran); delete that audit "
        "cell's directory to audit the cell with this config, or choose another --output-dir"
    )
    refuse_other_run(cell_dir / RUN_DIR, config, "", advice)
    check_audit_resumes(config, audit, cell_dir)
    task = resolve_task_config(config.task, check_model(config.model))
    check_canary_count(audit.canaries, load_splits(task).train)


def finished_audit(cell_dir: Path, config: RunConfig, audit: AuditConfig) -> AuditRecord | None:
    """The record of a finished audit of exactly this run config and these settings."""
    configs = {f"{RUN_DIR}/{CONFIG_FILE}": dump_config(config), SETTINGS_FILE: _dump(audit)}
    return AuditRecord.parse(finished_record(cell_dir, AUDIT_FILE, configs))


def run_audit_cell(
    config: RunConfig,
    audit: AuditConfig,
    cell_dir: Path,
    *,
    cache_dir: Path,
    tracking_uri: str,
    tags: dict[str, str],
    progress: bool,
) -> AuditRecord:
    """Train with canaries and audit (or go on with a stopped attempt); the settings file,
    written last, marks it finished."""
    record = _audited(config, audit, cell_dir) or run_audit(
        config,
        audit,
        cell_dir,
        cache_dir=cache_dir,
        progress=progress,
        tracking_uri=tracking_uri,
        tags=tags,
    )
    write_text_atomically(cell_dir / SETTINGS_FILE, _dump(audit))
    return record


def _audited(config: RunConfig, audit: AuditConfig, cell_dir: Path) -> AuditRecord | None:
    """The record of an audit stopped after its ``audit.json`` but before the settings file,
    once its draw shows it is of exactly this config and these settings."""
    record = AuditRecord.parse(read_json_object(cell_dir / AUDIT_FILE))
    if record is not None:
        load_draw(cell_dir, draw_digest(config, audit), "taking its finished audit")
    return record


def _dump(audit: AuditConfig) -> str:
    return yaml.safe_dump(audit.model_dump(mode="json"), sort_keys=True)
