"""Study type → the function that runs it (a registry, like the config's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from privzo.rundir import finished_record, write_json_atomically, write_text_atomically
from privzo.section import Section
from privzo.studies.scaling import ScalingStudyConfig, run_scaling_study
from privzo.studies.summary import StudyResult, SyntheticSummary
from privzo.synthetic import SyntheticStudyConfig, run_synthetic_study
from privzo.tracking import connect_tracker, keep_blank_stores_in, make_tracker
from privzo.tracking.tags import ROLE, STUDY

StudyRunner = Callable[..., StudyResult]
SYNTHETIC_CONFIG_FILE = "synthetic_config.yaml"
SYNTHETIC_SUMMARY_FILE = "synthetic_summary.json"


def run_synthetic(
    study: SyntheticStudyConfig,
    output_dir: Path,
    *,
    tracking_uri: str | None = None,
    tracking_root: Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    **_: Any,  # the scaling study's options (cache_dir, max_cells) do not apply
) -> SyntheticSummary:
    """The synthetic study as one MLflow run (config as params; the results and the Markdown
    table as artifacts, the selected rows as an MLflow table, the figure as a logged figure,
    which the MLflow UI shows); a finished study with the same config in ``output_dir`` is not
    run again."""
    output_dir = Path(output_dir).resolve()
    config_text = yaml.safe_dump(study.model_dump(mode="json"), sort_keys=False)
    reused = finished_record(
        output_dir, SYNTHETIC_SUMMARY_FILE, {SYNTHETIC_CONFIG_FILE: config_text}
    )
    if reused is not None:
        echo(f"synthetic study: reusing the finished study in {output_dir} (same config)")
        return SyntheticSummary.from_dict(reused)
    tracker = make_tracker(
        "mlflow",
        uri=tracking_uri,
        experiment="synthetic-quadratic",
        output_root=Path(tracking_root or output_dir).resolve(),
        run_name=f"synthetic-{output_dir.name}",
        tags={ROLE: "study", STUDY: "synthetic-quadratic"},
    )
    connect_tracker(tracker, tracking_uri)
    output_dir.mkdir(parents=True, exist_ok=True)
    with tracker:
        tracker.log_params(study.model_dump(mode="json"))
        result = run_synthetic_study(study, output_dir, progress=progress, tracker=tracker)
        tracker.log_metrics(
            {"noise_multiplier": result.noise_multiplier, "seconds": result.seconds}, step=0
        )
        for path in (result.results_path, result.table_path):  # the figure: log_figure
            tracker.log_artifact(path)
        summary = SyntheticSummary(
            study="synthetic-quadratic",
            complete=True,
            parent_run_id=tracker.run_id,
            noise_multiplier=result.noise_multiplier,
            seconds=result.seconds,
            table=str(result.table_path),
            figure=str(result.figure_path),
        )
    echo(result.table_path.read_text())
    write_text_atomically(output_dir / SYNTHETIC_CONFIG_FILE, config_text)
    write_json_atomically(output_dir / SYNTHETIC_SUMMARY_FILE, summary.to_dict())
    return summary


STUDY_RUNNERS: dict[type[Section], StudyRunner] = {
    ScalingStudyConfig: run_scaling_study,
    SyntheticStudyConfig: run_synthetic,
}


def run_study(study: Section, output_dir: Path, **options: Any) -> StudyResult:
    """Run (or resume) ``study`` with the runner registered for its config type."""
    runner = STUDY_RUNNERS.get(type(study))
    if runner is None:
        raise ValueError(f"no runner registered for {type(study).__name__}")
    if options.get("cache_dir") is not None:  # the study's store opens before its first cell
        keep_blank_stores_in(options["cache_dir"])
    return runner(study, output_dir, **options)
