"""One privzo run as a Ray job.

    ray job submit --working-dir . -- python jobs/run.py --config configs/runs/X.yaml \
        [--output-dir DIR] [key=value ...]

The job's driver runs in an unpacked copy of the working dir, with ``RAY_ADDRESS`` set, so the
run connects to the cluster it was submitted to. Point ``--output-dir`` at shared storage and
``MLFLOW_TRACKING_URI`` (or ``tracking.uri``) at an MLflow server: the job's own directory is
temporary. Prints the run's summary as JSON (``ray job logs`` shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))  # the submitted working dir's privzo comes first

# `ray.train.report` is a barrier that waits on a health check, every 2 s by default.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="run config (YAML)")
    parser.add_argument("--output-dir", type=Path, default=None, help="default: runs/<config>")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/privzo").expanduser())
    parser.add_argument("--overwrite", action="store_true")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(argv)
    from privzo.config import ConfigError, load_config
    from privzo.run import run

    try:
        config = load_config(args.config, overrides)
        summary = run(
            config,
            args.output_dir or Path("runs") / args.config.stem,
            cache_dir=args.cache_dir,
            progress=False,
            overwrite=args.overwrite,
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
        )
    except (ConfigError, ValueError, OSError) as error:
        print(f"privzo job: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"privzo_summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
