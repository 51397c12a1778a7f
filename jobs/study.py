"""Entry point for `ray job submit`: a study (e.g. scaling over model sizes).

    ray job submit --working-dir . -- python jobs/study.py \\
        --config configs/studies/tiny-scaling.yaml --output-dir /shared/runs/tiny-scaling

--output-dir must be storage every node sees; running the same command again resumes the study
(finished cells are not run again). The report lands in OUTPUT_DIR/report/ and on the study's
MLflow run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))  # the submitted working dir's privzo comes first

from privzo.cli import main as privzo_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a study config (YAML)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--cache-dir", help="where built-in models are cached")
    parser.add_argument("--max-cells", help="train at most this many cells in this job")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the study")
    args = parser.parse_args(argv)
    command = ["study", args.config, *args.overrides, "--output-dir", args.output_dir]
    if args.cache_dir:
        command += ["--cache-dir", args.cache_dir]
    if args.max_cells:
        command += ["--max-cells", args.max_cells]
    return privzo_main(command)


if __name__ == "__main__":
    sys.exit(main())
