"""Entry point for `ray job submit`: a search under a fixed privacy budget.

    ray job submit --working-dir . -- python jobs/tune.py \\
        --config configs/searches/opt-1.3b-sst2.yaml --output-dir /shared/runs/opt-1.3b-sst2

Inside a Ray job, RAY_ADDRESS is set and the search joins the cluster. --output-dir must be
storage every node sees (the job itself runs in a temporary copy of the working dir); running
the same command again resumes the search there.
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
    parser.add_argument("--config", required=True, help="a search config (YAML)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--cache-dir", help="where built-in models are cached")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the search")
    args = parser.parse_args(argv)
    command = ["tune", args.config, *args.overrides, "--output-dir", args.output_dir]
    if args.cache_dir:
        command += ["--cache-dir", args.cache_dir]
    return privzo_main(command)


if __name__ == "__main__":
    sys.exit(main())
