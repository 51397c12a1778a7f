"""``privzo study`` and ``privzo report``: many runs as one study (e.g. scaling over model
sizes), and its tables, plots and report from MLflow."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from privzo.cli.arguments import (
    Commands,
    add_command,
    add_config,
    directory_argument,
    finish_command,
    tracking_uri,
)
from privzo.cli.process import quiet_libraries, use_process_cores


def add_study(commands: Commands) -> None:
    study = add_command(
        commands,
        "study",
        "a study (e.g. scaling over model sizes); resumes in the same dir",
        [
            "privzo study configs/studies/tiny-scaling.yaml --output-dir runs/tiny-scaling",
            "privzo study configs/studies/tiny-scaling.yaml --output-dir runs/tiny-scaling "
            "--max-cells 2",
        ],
        description="Train a study's cells one after another, each a run in its own directory "
        "under one MLflow experiment, then build its report; the same command resumes.",
    )
    add_config(
        study,
        "study",
        "configs/studies/*.yaml",
        overrides="key.sub=value overrides of the study config",
    )
    study.add_argument(
        "--output-dir",
        type=directory_argument,
        required=True,
        help="the study's directory (its cells)",
    )
    study.add_argument(
        "--max-cells",
        type=int,
        help="train at most this many cells now (exit 3 while cells remain; default: all)",
    )
    finish_command(study, _study_command, quiet="no progress bars")


def _study_command(args: argparse.Namespace) -> int:
    from privzo.studies import load_study_config, run_study

    quiet_libraries(args.verbose)
    study = load_study_config(args.config, args.overrides)
    use_process_cores()  # cells train one after another in this process
    options: dict[str, Any] = {
        "cache_dir": args.cache_dir,
        "tracking_uri": tracking_uri(),
        "progress": not args.quiet,
    }
    if args.max_cells is not None:
        options["max_cells"] = args.max_cells
    summary = run_study(study, args.output_dir, **options)
    violated = summary.violated_audits()
    if violated:
        from privzo.audit import VIOLATED_EXIT_CODE

        print(f"privzo: PRIVACY VIOLATED in audit cells {violated}", file=sys.stderr)
        return VIOLATED_EXIT_CODE
    return 0 if summary.complete else 3


def add_report(commands: Commands) -> None:
    report = add_command(
        commands,
        "report",
        "scaling tables, plots and a report from MLflow",
        "privzo report --tracking-uri sqlite:///$PWD/runs/tiny-scaling/mlflow.db "
        "--experiment tiny-scaling --output-dir runs/report",
    )
    report.add_argument("--experiment", required=True, help="the MLflow experiment name")
    report.add_argument(
        "--output-dir",
        type=directory_argument,
        required=True,
        help="where the tables, plots and report go",
    )
    report.add_argument("--study", help="only this study's runs (its cells; default: every run)")
    report.add_argument("--tracking-uri", help="default: MLFLOW_TRACKING_URI")
    report.set_defaults(handler=_report_command)


def _report_command(args: argparse.Namespace) -> int:
    from privzo.analysis import build_report

    quiet_libraries(verbose=False)
    uri = args.tracking_uri or tracking_uri()
    if not uri:
        raise ValueError(
            "give --tracking-uri (e.g. sqlite:///runs/study/mlflow.db) or set MLFLOW_TRACKING_URI"
        )
    build_report(uri, args.experiment, args.output_dir, study=args.study)
    return 0
