"""The embedded default: zero-shot vs a private (DPZero) run vs a non-private (MeZO) run, then a
small search over the private run's clipping, learning rate and steps at the same (ε, δ).

Offline on a CPU: a built-in OPT-style model pretrained briefly (first-order) on a public
synthetic corpus is fine-tuned on a disjoint synthetic private sentiment task, and every arm is
scored on the same held-out test set and recorded in one MLflow store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from privzo.config.loading import load_config
from privzo.config.run import RunConfig
from privzo.run import finished_run, refuse_other_run, run, starts_over
from privzo.rundir import RunSummary
from privzo.threads import threads_per_process, use_threads
from privzo.tracking.store import default_tracking_uri, ui_lines

# Shipped inside the package (package data), so an installed privzo runs the demo anywhere; the
# checkout's configs/ links to these files.
CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "runs"
ARMS = {"dpzero": "tiny-dpzero.yaml", "mezo": "tiny-mezo.yaml"}
SEARCH_CONFIG = "../searches/tiny.yaml"  # relative to the run configs
STUDY_CONFIG = "../studies/tiny-scaling.yaml"
QUICK_SEARCH_STEPS = [20, 40]
QUICK_STUDY_STEPS = 20
# --quick is a smoke test: the two smaller sizes still make a scaling table, and skip the
# largest model's one-off pretraining (most of the quick demo's time on a cold cache)
QUICK_STUDY_MODELS = ["demo-opt-s", "demo-opt-m"]
# the MLflow experiments of the arms, the search and the study (their configs name them)
DEMO_EXPERIMENTS = ["privzo-tiny", "privzo-tiny-search", "tiny-scaling"]


def run_demo(
    output_dir: Path,
    *,
    cache_dir: Path,
    quick: bool = False,
    arms_only: bool = False,
    config_dir: Path = CONFIG_DIR,
    cores: int = 1,
) -> list[DemoRow]:
    """Run (or reuse finished) demo arms under ``output_dir``, print the comparison table, then
    run (or resume) the small search in ``output_dir/search`` and the scaling study over the
    built-in model sizes in ``output_dir/scaling``, printing their tables and each part's time.

    ``cores`` is what this process may use (the entry point reads its affinity and cgroup
    quota): the parts run one at a time, each sized to all of it.
    """
    output_dir = Path(output_dir).resolve()
    if not all((config_dir / name).is_file() for name in ARMS.values()):
        raise FileNotFoundError(
            f"the demo's configs {sorted(ARMS.values())} are not in {config_dir}: the "
            "installation is incomplete (they ship as package data); reinstall privzo"
        )
    use_threads(cores)  # the arms and the study's cells train in this process, one at a time
    started = time.perf_counter()
    with timed("arms"):
        rows = _run_arms(output_dir, cache_dir, config_dir, quick)
    if not arms_only:
        with timed("search"):
            _run_search(output_dir / "search", cache_dir, config_dir / SEARCH_CONFIG, quick, cores)
        with timed("scaling study"):
            _run_scaling_study(output_dir / "scaling", cache_dir, config_dir / STUDY_CONFIG, quick)
    print(f"\ndemo: {time.perf_counter() - started:.0f} s in all ({cores} cores)")
    experiments = ["privzo-tiny"] if arms_only else DEMO_EXPERIMENTS
    command, *addresses = ui_lines(default_tracking_uri(output_dir), experiments)
    print(f"\nMLflow records: {command}\nthen open each experiment's runs:", *addresses, sep="\n")
    return rows


@contextmanager
def timed(part: str, echo: Callable[[str], None] = print) -> Iterator[None]:
    """Print the part's measured wall time when it ends (also when it fails)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        echo(f"[{part}: {time.perf_counter() - started:.0f} s]")


def _run_arms(output_dir: Path, cache_dir: Path, config_dir: Path, quick: bool) -> list[DemoRow]:
    """Each arm finished, resumed from its own trajectory (as the same ``privzo run`` would) or
    trained; an arm directory holding another config's run is refused before any arm trains."""
    overrides = ["optimizer.steps=20"] if quick else []
    configs = {arm: load_config(config_dir / name, overrides) for arm, name in ARMS.items()}
    _check_arm_dirs(output_dir, configs)
    summaries: dict[str, RunSummary] = {}
    for arm, config in configs.items():
        arm_dir = output_dir / arm
        reused = finished_run(config, arm_dir, cache_dir=cache_dir, tracking_root=output_dir)
        if reused is not None:
            print(f"{arm}: reusing the finished run in {arm_dir} (same config)")
            summaries[arm] = reused
            continue
        print(f"{arm}: fine-tuning with {config_dir / ARMS[arm]} {' '.join(overrides)}")
        summaries[arm] = run(
            config,
            arm_dir,
            cache_dir=cache_dir,
            tracking_root=output_dir,
            overwrite=starts_over(config, arm_dir),  # an interrupted arm goes on, into its run
        )
    rows = _table_rows(summaries)
    print(format_table(rows))
    return rows


def _check_arm_dirs(output_dir: Path, configs: dict[str, RunConfig]) -> None:
    """Exactly this config is reused or resumed (a --quick arm is not, for the full demo): an
    arm whose directory holds another config's run is refused, its released steps kept."""
    advice = (
        "(the demo's with or without --quick, say); choose another --output-dir, or delete "
        "that directory to run the arm again"
    )
    for arm, config in configs.items():
        refuse_other_run(output_dir / arm, config, f"demo arm {arm}: ", advice)


def _run_search(
    output_dir: Path, cache_dir: Path, config_path: Path, quick: bool, cores: int
) -> None:
    import ray

    from privzo.search import SearchConfig, load_search_config, run_search

    data = load_search_config(config_path).model_dump(mode="json")
    if quick:
        data["space"]["optimizer.steps"] = QUICK_SEARCH_STEPS
    # the trials that run at once share this machine's cores (the config's count assumes two)
    resources = data["resources"]
    resources["cpus_per_trial"] = threads_per_process(cores, resources["concurrency"])
    search = SearchConfig.model_validate(data)
    print(f"\nsearch: {config_path.resolve()} (Ray Tune; every trial at the same (ε, δ))")
    try:
        summary = run_search(
            search,
            output_dir,
            cache_dir=cache_dir,
            num_cpus=cores,
            tracking_root=output_dir.parent,
            progress=False,
        )
    finally:
        # Ray's daemons and idle trial workers would take CPU from the study that follows
        ray.shutdown()
    if summary.interrupted:  # Tune takes the Ctrl+C itself; the demo stops there too
        raise KeyboardInterrupt


def _run_scaling_study(output_dir: Path, cache_dir: Path, config_path: Path, quick: bool) -> None:
    from privzo.studies import load_study_config, run_study
    from privzo.studies.config import ScalingStudyConfig

    study = load_study_config(config_path)
    assert isinstance(study, ScalingStudyConfig), "the demo's study is a scaling study"
    if quick:
        overrides = {**study.overrides, "optimizer.steps": QUICK_STUDY_STEPS}
        study = study.model_copy(update={"overrides": overrides, "models": QUICK_STUDY_MODELS})
    print(f"\nscaling study: {config_path.resolve()} (zero-shot vs private vs non-private)")
    run_study(study, output_dir, cache_dir=cache_dir, tracking_root=output_dir.parent)


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo's comparison: a method's test accuracy and what it spent."""

    method: str
    accuracy: float | None
    epsilon: float | None
    steps: int
    seconds: float | None
    delta: float | None = None


def _table_rows(summaries: dict[str, RunSummary]) -> list[DemoRow]:
    zero_shot = summaries["dpzero"].scores["accuracy_before"]
    rows = [DemoRow("zero-shot", zero_shot, epsilon=None, steps=0, seconds=None)]
    for arm, label in (("dpzero", "DPZero (private)"), ("mezo", "MeZO (non-private)")):
        summary = summaries[arm]
        rows.append(
            DemoRow(
                label,
                summary.scores["accuracy_after"],
                summary.epsilon,
                summary.steps,
                summary.wall_time_s,
                summary.delta,
            )
        )
    return rows


def format_table(rows: list[DemoRow]) -> str:
    lines = [f"\n{'method':<22}{'test accuracy':>14}{'epsilon':>10}{'steps':>7}{'time s':>8}"]
    for row in rows:
        epsilon = "-" if row.epsilon is None else f"{row.epsilon:.2f}"
        seconds = "-" if row.seconds is None else f"{row.seconds:.0f}"
        lines.append(
            f"{row.method:<22}{row.accuracy:>14.3f}{epsilon:>10}{row.steps:>7}{seconds:>8}"
        )
    return "\n".join(lines)
