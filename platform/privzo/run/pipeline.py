"""One fine-tuning run, end to end: validate → plan privacy → load → train → evaluate → record.

Everything that can be wrong with the input (config, files, model, an unreachable budget) is
checked before the first forward pass and before anything is written, so a bad run costs nothing
and erases nothing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import check_built, writes_trajectory
from privzo.config import ConfigError, RunConfig, dump_config
from privzo.dirlock import locks_output_dir
from privzo.layouts.context import PlannedData, RunContext, RunHooks, build_context
from privzo.layouts.layout import get_layout
from privzo.layouts.record import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    prepare_output_dir,
)
from privzo.layouts.resume import RunDirectoryProgress
from privzo.layouts.train import train_and_evaluate
from privzo.preflight import preflight
from privzo.privacy.plan import privacy_record
from privzo.replay import MODEL_LOADER, write_model_data
from privzo.run.directory import RunRecords, resume_point, write_records
from privzo.tracking import Tracker, connect_tracker, make_tracker
from privzo.tracking.tags import MODEL_URI


@locks_output_dir  # one run per directory, held before anything is checked or loaded
def run(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    overwrite: bool = False,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    hooks: RunHooks | None = None,
) -> dict[str, Any]:
    """Fine-tune, evaluate and record one run; returns the summary written to summary.json.

    ``tracking_uri`` (e.g. from the environment, read by the CLI) is used when the config sets
    none; it is not written to the config, and no tracking URI is logged (it may hold secrets).
    ``tags`` are added to the run's own (e.g. ``mlflow.parentRunId`` for a search's trial).
    """
    output_dir = Path(output_dir).resolve()
    resume = None if overwrite else resume_point(config, output_dir)
    checked = preflight(  # everything that can refuse the run, before any weights load
        config,
        output_dir=output_dir if resume is None else None,  # a resumed run goes on there
        overwrite=overwrite,
        tracking_uri=tracking_uri,
        tracking_root=tracking_root or output_dir.parent,
    )
    if config.parallel.strategy != "single":  # Ray Train workers (privzo.distributed)
        from privzo.distributed.launch import run_distributed

        if hooks is not None and hooks.training_rows is not None:
            raise ConfigError(
                f"parallel.strategy={config.parallel.strategy!r}: an audit's canaries need the "
                "training rows in this process; use strategy 'single'"
            )
        return run_distributed(
            config,
            output_dir,
            cache_dir=cache_dir,
            progress=progress,
            overwrite=overwrite,
            tracking_root=tracking_root,
            tracking_uri=tracking_uri,
            tags=tags,
            hooks=hooks,
            plan=checked.privacy,
        )
    planned = PlannedData(checked.task_config, checked.splits, checked.privacy)
    context = build_context(config, cache_dir, progress, hooks or RunHooks(), planned)
    check_built(context)  # the algorithm's own checks (DPGD-0th's noise size): nothing written yet
    tracker = _connect_tracker(context, output_dir, tracking_root, tracking_uri, tags)
    if resume is None:
        prepare_output_dir(output_dir)
        (output_dir / CONFIG_FILE).write_text(dump_config(config))
    elif resume.tracking_run_id is not None:
        tracker.attach(resume.tracking_run_id)  # the same MLflow run goes on
    with tracker:
        if resume is None:
            params = config.model_dump(mode="json")
            params["tracking"].pop("uri")
            tracker.log_params(params)
            tracker.log_inputs(context.data_lineage())
        trained = train_and_evaluate(
            context,
            tracker,
            get_layout("single"),
            0,
            RunDirectoryProgress(output_dir, resume),
            model_dir=output_dir / MODEL_DIR,
            show_progress=progress,
        )
        assert trained.summary is not None, "a single process reports"
        summary = trained.summary.to_dict()
        privacy = privacy_record(context.plan, trained.loop.ledger)
        write_records(output_dir, RunRecords(summary, privacy))
        for name in (CONFIG_FILE, TRAJECTORY_FILE, PRIVACY_FILE, SUMMARY_FILE):
            if (output_dir / name).exists():  # first-order baselines write no trajectory
                tracker.log_artifact(output_dir / name)
        if writes_trajectory(config):
            _log_replayable_model(tracker, config, output_dir, cache_dir)
    return summary


def _log_replayable_model(
    tracker: Tracker, config: RunConfig, output_dir: Path, cache_dir: Path
) -> None:
    """The run's fine-tuned model as a backend model (MLflow: ``runs:/<id>/model``): the base
    reference and the trajectory, rebuilt by replay when loaded. Its URI is tagged."""
    with tempfile.TemporaryDirectory() as scratch:
        data = write_model_data(
            Path(scratch) / "replay",
            config.model.name_or_path,
            output_dir / TRAJECTORY_FILE,
            cache_dir,
        )
        uri = tracker.log_model(data, MODEL_LOADER)
    if uri is not None:
        tracker.set_tags({MODEL_URI: uri})


def _connect_tracker(
    context: RunContext,
    output_dir: Path,
    tracking_root: Path | None,
    tracking_uri: str | None,
    tags: Mapping[str, str] | None = None,
) -> Tracker:
    """Build the tracker and reach its store now, so a bad store fails before training."""
    tracking = context.config.tracking
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=(tracking_root or output_dir.parent).resolve(),
        run_name=tracking.run_name or output_dir.name,
        tags={**context.tracking_tags(), **(tags or {})},
        release_timing=context.config.releases_diagnostics,
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)
