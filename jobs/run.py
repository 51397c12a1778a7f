"""Entry point for `ray job submit`: one privzo run.

    ray job submit --working-dir . -- python jobs/run.py --config configs/runs/X.yaml \\
        [--output-dir DIR] [key=value ...]

The job's driver runs in an unpacked copy of the working dir, with ``RAY_ADDRESS`` set, so the
run connects to the cluster it was submitted to. That copy is temporary, so a relative
``--output-dir`` is refused; without one the run goes to ``~/privzo-runs/<config name>`` on the
node that runs the job. Point ``--output-dir`` at shared storage and ``MLFLOW_TRACKING_URI`` (or
``tracking.uri``) at an MLflow server. Prints the run's summary as one JSON line (``ray job logs``
shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))  # the submitted working dir's privzo comes first

from privzo.cli import main as privzo_main  # noqa: E402

# `ray.train.report` is a barrier that waits on a health check, every 2 s by default.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a run config (YAML)")
    parser.add_argument(
        "--output-dir", help="an absolute path (default: ~/privzo-runs/<config name>)"
    )
    parser.add_argument("--cache-dir", help="where built-in models are cached")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the run")
    args = parser.parse_args(argv)
    output_dir = args.output_dir or str(default_output_dir(args.config))
    print(f"privzo job: the run's directory is {output_dir}", file=sys.stderr, flush=True)
    command = ["run", args.config, *args.overrides, "--output-dir", output_dir]
    command += ["--quiet", "--json"]
    if args.cache_dir:
        command += ["--cache-dir", args.cache_dir]
    if args.overwrite:
        command += ["--overwrite"]
    return privzo_main(command)


def default_output_dir(config: str) -> Path:
    """Where a run goes without --output-dir: an absolute path, since the job's working
    directory is Ray's temporary copy."""
    return Path.home() / "privzo-runs" / Path(config).stem


if __name__ == "__main__":
    sys.exit(main())
