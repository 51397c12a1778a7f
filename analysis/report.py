"""Build the scaling report of an MLflow experiment: `privzo report`, run as a script.

    python analysis/report.py --tracking-uri sqlite:///runs/demo/mlflow.db \\
        --experiment tiny-scaling --study tiny-scaling --output-dir runs/demo/report

Writes runs.parquet (one row per finished run), scaling.parquet, privacy_gap.parquet,
resources.parquet, the PNG plots and report.md. The Parquet files load in pandas / pyarrow /
polars for your own analysis: `pd.read_parquet("runs/demo/report/runs.parquet")`.

The options are the command's (`privzo report --help`): the CLI owns them, this script hands
its arguments over, so the two cannot drift apart.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from privzo.cli import main as privzo_main


def main(argv: Sequence[str] | None = None) -> int:
    return privzo_main(["report", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
