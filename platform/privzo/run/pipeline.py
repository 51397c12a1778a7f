"""One fine-tuning run, end to end: validate → plan privacy → load → train → evaluate → record.

Everything that can be wrong with the input (config, files, model, an unreachable budget) is
checked before the first forward pass and before anything is written, so a bad run costs nothing
and erases nothing. Every layout goes through the same steps here (preflight, the tracker, the
run directory, params, records, artifacts); what differs is where it trains (``training``: in
this process or on Ray Train workers). The tracking run around the training is ``tracked``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from privzo.config.run import RunConfig
from privzo.dirlock import locks_output_dir
from privzo.distributed.cluster import RayTarget
from privzo.layouts.context import RunHooks
from privzo.preflight import Preflight, preflight
from privzo.privacy import keep_epsilons_in
from privzo.run.tracked import connect_run_tracker, end_tracking, train_tracked
from privzo.run.training import make_training
from privzo.rundir import (
    RunSummary,
    finished,
    mark_tracked,
    prepare_output_dir,
    released_nothing,
    resume_point,
    untracked,
    write_config,
)
from privzo.tracking import TrackingStoreError, keep_blank_stores_in

logger = logging.getLogger(__name__)


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
    on_checked: Callable[[Preflight], None] | None = None,
    cluster: RayTarget | None = None,
    run_name: str | None = None,
) -> RunSummary:
    """Fine-tune, evaluate and record one run; returns the summary written to summary.json.

    ``tracking_uri`` (e.g. from the environment, read by the CLI) is used when the config sets
    none; it is not written to the config, and no tracking URI is logged (it may hold secrets).
    ``tags`` are added to the run's own (e.g. ``privzo.tracking.tags.PARENT_RUN`` for a
    search's trial).
    ``on_checked`` receives the preflight's findings before anything loads (the CLI prints which
    rows the run trains on). ``cluster`` says which Ray a distributed layout joins or starts
    (``privzo.distributed.cluster``; default: a new local one). ``run_name`` names the
    MLflow run when the config sets none (default: ``run_label``, algorithm, ε, model, seed, task).
    """
    output_dir = Path(output_dir).resolve()
    keep_epsilons_in(cache_dir)  # a rerun, a resume or a search's next trial calibrates anew
    keep_blank_stores_in(cache_dir)  # a new output directory's MLflow store, without migrations
    stopped = None if overwrite else untracked(output_dir, config)
    if stopped is not None:  # trained and recorded: only its tracking run is left to end
        try:
            return end_tracking(
                config,
                output_dir,
                stopped,
                cache_dir,
                (tracking_root, tracking_uri),
                run_name,
                tags,
            )
        except TrackingStoreError as error:
            raise _store_stopped(error, output_dir) from error
    resume = None if overwrite else resume_point(config, output_dir)
    overwrite = overwrite or (resume is None and _starts_again(config, output_dir))
    checked = preflight(  # everything that can refuse the run, before any weights load
        config,
        output_dir=output_dir if resume is None else None,  # a resumed run goes on there
        overwrite=overwrite,
        tracking_uri=tracking_uri,
        tracking_root=tracking_root or output_dir.parent,
    )
    if on_checked is not None:
        on_checked(checked)
    training = make_training(
        config,
        checked,
        output_dir,
        cache_dir,
        progress,
        hooks,
        resume,
        (tracking_root, tracking_uri),
        cluster,
    )
    tracker = connect_run_tracker(
        config,
        output_dir,
        tracking_root,
        tracking_uri,
        {**training.tags(), **(tags or {})},
        run_name,
    )
    if resume is None:
        prepare_output_dir(output_dir)
        write_config(output_dir, config)
    try:
        records = train_tracked(tracker, training, config, output_dir, cache_dir, resume)
    except TrackingStoreError as error:
        raise _store_stopped(error, output_dir) from error
    mark_tracked(output_dir)
    return records.summary


def _store_stopped(error: TrackingStoreError, output_dir: Path) -> TrackingStoreError:
    """A store's failure (its metrics, its artifacts) as the line that says what to do: the
    run directory keeps what the store did not take, and the same command goes on."""
    return TrackingStoreError(
        f"{error}. The run in {output_dir} keeps its steps: once the store takes writes "
        "again (free its disk, fix its permissions, or, where the config sets no "
        "tracking.uri, point MLFLOW_TRACKING_URI at another store), the same command goes "
        "on from them"
    )


def _starts_again(config: RunConfig, output_dir: Path) -> bool:
    """Whether an earlier attempt at ``config`` in ``output_dir`` kept no step, so the run
    starts there again (``released_nothing``), saying so."""
    if not released_nothing(output_dir, config):
        return False
    logger.warning(
        "the earlier attempt in %s stopped before it kept any step (its MLflow run stays as "
        "it ended): the run starts again from step 0",
        output_dir,
    )
    return True


def finished_run(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
) -> RunSummary | None:
    """The summary of a finished run of exactly ``config`` in ``output_dir``, else None; a run
    killed after its summary first has its tracking run ended (as ``run`` would): what
    searches, studies and the demo ask before a trial, a cell or an arm trains."""
    if untracked(Path(output_dir), config) is None:
        return finished(Path(output_dir), config)
    return run(  # under the directory's lock, ``run`` ends the tracking run and trains nothing
        config,
        output_dir,
        cache_dir=cache_dir,
        tracking_root=tracking_root,
        tracking_uri=tracking_uri,
    )
