"""A hyperparameter search under a fixed privacy budget, on Ray Tune, recorded in MLflow.

plan (privzo.search.plan) → parent MLflow run → Tune trials (each a normal privzo run and a
child MLflow run) → ``trials.parquet``, ``search_summary.json`` and a printed table. A search
directory remembers its parent run and trial count, so running the same search again resumes
it: Tune restores its experiment and finished trials are not run again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from privzo.distributed.cluster import RayCluster, RayTarget, choose_cluster, connect_ray
from privzo.distributed.launch import ray_runtime_env
from privzo.distributed.storage import alive_nodes, check_cluster_storage
from privzo.privacy import keep_epsilons_in
from privzo.rundir import write_json_atomically, write_text_atomically
from privzo.search.config import SearchConfig
from privzo.search.plan import SearchPlan, plan_search
from privzo.search.record import SEARCH_CONFIG_FILE, record_search
from privzo.search.resources import TrialResources, check_trial_resources
from privzo.search.summary import SearchSummary
from privzo.search.tuner import SearchPlaces, fit
from privzo.section import ConfigError
from privzo.tracking import Tracker, connect_tracker, keep_blank_stores_in, make_tracker
from privzo.tracking.tags import ALGORITHM, EPSILON, MODEL, ROLE, TASK

STATE_FILE = "search_state.json"


@dataclass
class SearchState:
    """What a resumed search reuses: its parent run and its (secretly drawn) trial count."""

    fingerprint: str
    trial_count: int
    parent_run_id: str | None

    @classmethod
    def load(cls, path: Path) -> SearchState | None:
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, path: Path) -> None:
        write_json_atomically(path, asdict(self))


def search_fingerprint(search: SearchConfig) -> str:
    text = json.dumps(search.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_search(
    search: SearchConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    cluster: RayTarget | None = None,
    num_cpus: int | None = None,
    tracking_uri: str | None = None,
    tracking_root: Path | None = None,
    tags: dict[str, str] | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> SearchSummary:
    """Plan, run (or resume) and record the search; returns the search summary.

    Without a tracking URI the MLflow store is sqlite under ``tracking_root`` (default
    ``output_dir``), shared by the parent run and every trial. ``num_cpus`` is what a local Ray
    (started when ``cluster`` points to no running one) may schedule: the cores this process
    may use, which Ray would otherwise take from the machine; a joined cluster keeps its own.
    """
    output_dir = Path(output_dir).resolve()
    keep_epsilons_in(cache_dir)  # each trial's calibration, as the trials' runs keep theirs
    keep_blank_stores_in(cache_dir)  # the search's store is opened before any trial's run
    tracking_root = Path(tracking_root or output_dir).resolve()
    state_path = output_dir / STATE_FILE
    state = SearchState.load(state_path)
    fingerprint = search_fingerprint(search)
    if state is not None and state.fingerprint != fingerprint:
        raise ConfigError(
            f"--output-dir {str(output_dir)!r} holds a different search; choose another "
            "directory (a search resumes only with exactly the same config)"
        )
    plan = plan_search(search, cache_dir, trial_count=state.trial_count if state else None)
    local = _local_resources(cluster, num_cpus)
    if local is not None:  # a search the machine cannot run is refused before Ray starts
        check_trial_resources(search, plan.base, local)
    echo(start_ray(cluster, num_cpus).line())
    _check_cluster(plan, output_dir, tracking_uri)  # before the tracker writes a local store
    resources = _check_resources(plan)
    tracker = _parent_tracker(plan, output_dir, tracking_root, tracking_uri, tags or {})
    output_dir.mkdir(parents=True, exist_ok=True)
    if state is None:
        tracker.start()
        state = SearchState(fingerprint, plan.trial_count, tracker.run_id)
        state.save(state_path)
        tracker.log_params(search.model_dump(mode="json"))
        write_text_atomically(
            output_dir / SEARCH_CONFIG_FILE,
            yaml.safe_dump(search.model_dump(mode="json"), sort_keys=False),
        )
    else:
        echo(f"resuming the search in {output_dir}")
        if state.parent_run_id is not None:
            tracker.attach(state.parent_run_id)
        else:
            tracker.start()
    with tracker:
        places = SearchPlaces(output_dir, cache_dir, tracking_root, tracking_uri)
        results = fit(plan, state.parent_run_id, places, resources, progress)
        summary = record_search(plan, results, output_dir, tracker)
        if summary.interrupted:
            tracker.finish("KILLED")
    echo("\n".join(summary.lines()))
    if summary.interrupted:
        echo(f"the search was interrupted; run the same command again to resume it in {output_dir}")
    return summary


def _parent_tracker(
    plan: SearchPlan,
    output_dir: Path,
    tracking_root: Path,
    tracking_uri: str | None,
    extra_tags: dict[str, str],
) -> Tracker:
    tracking, base = plan.base.tracking, plan.base
    tags = {
        ROLE: "search",
        MODEL: base.model.name_or_path,
        TASK: base.task.name,
        ALGORITHM: base.optimizer.algorithm,
        "privzo.search_algorithm": plan.search.algorithm,
    }
    if plan.private:
        tags[EPSILON] = f"{base.privacy.epsilon:g}"
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=tracking_root,
        run_name=f"search-{output_dir.name}",
        tags={**tags, **extra_tags},
        release_timing=base.releases_diagnostics,  # the trials' times add up to the search's
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def start_ray(cluster: RayTarget | None, num_cpus: int | None) -> RayCluster:
    """Join the cluster ``cluster`` points to (keeping its own CPU count) or start a local Ray with
    ``num_cpus``; trials import this privzo, not a node's."""
    return connect_ray(cluster, ray_runtime_env({}), num_cpus)


def _check_cluster(plan: SearchPlan, output_dir: Path, tracking_uri: str | None) -> None:
    """On a cluster of several nodes, trials run on every node: Tune's state and the trials'
    run directories (under --output-dir) and the tracking store must be reachable from all."""
    tracking = plan.base.tracking
    check_cluster_storage(
        alive_nodes(),
        str(output_dir),
        tracking.uri or tracking_uri,
        storage_setting="--output-dir",
        uri_allowed=False,
        tracking=tracking.backend != "none",
    )


def _local_resources(ray_target: RayTarget | None, num_cpus: int | None) -> dict[str, float] | None:
    """What a local Ray not yet started will schedule (``num_cpus`` CPUs, the GPUs torch sees);
    None when joining a cluster or when Ray already runs (its own counts are checked)."""
    import ray

    target = ray_target or RayTarget()
    choice = choose_cluster(target.address, target.env_address, target.file_text())
    if choice.joins or num_cpus is None or ray.is_initialized():
        return None
    import torch

    return {"CPU": float(num_cpus), "GPU": float(torch.cuda.device_count())}


def _check_resources(plan: SearchPlan) -> TrialResources:
    """A trial (and, for distributed trials, every concurrent one) must fit on the cluster, or
    Tune would wait for it forever."""
    import ray

    return check_trial_resources(plan.search, plan.base, dict(ray.cluster_resources()))
