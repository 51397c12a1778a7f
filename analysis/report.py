"""Build the scaling report of an MLflow experiment (the same as `privzo report`).

    python analysis/report.py --tracking-uri sqlite:///runs/demo/mlflow.db \\
        --experiment tiny-scaling --study tiny-scaling --output-dir runs/demo/report

Writes runs.parquet (one row per finished run), scaling.parquet, privacy_gap.parquet,
resources.parquet, the PNG plots and report.md. The Parquet files load in pandas / pyarrow /
polars for your own analysis: `pd.read_parquet("runs/demo/report/runs.parquet")`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from privzo.analysis import build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--study", help="only this study's cells")
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    build_report(args.tracking_uri, args.experiment, args.output_dir, study=args.study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
