"""``python -m privzo.cli ARGS`` for tests that run many commands: each command runs in a new
process forked from one server that imported privzo's CLI and its libraries once
(multiprocessing's fork server), so a command costs what it does, not seconds of imports.

The child takes the command's working directory and environment, writes its standard output
and error to files, and exits with the CLI's exit code, as the command would.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path

# what the commands import anyway (a command imports the rest itself, as it would)
PRELOADED = [
    "torch",
    "transformers",
    "mlflow",
    "ray",
    "pandas",
    "pyarrow.parquet",
    "privzo.cli.entry",
    "privzo.run",
    "forked_cli",
]


@dataclass(frozen=True)
class Done:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would return of it."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(argv: list[str], cwd: Path, env: dict[str, str], logs: Path, timeout: float) -> Done:
    """Run ``privzo ARGV`` in ``cwd`` with ``env``; its output goes through ``logs``.stdout/.err
    files. A command still running after ``timeout`` seconds is killed (exit code -9)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    out, err = logs.with_suffix(".stdout"), logs.with_suffix(".stderr")
    process = context.Process(target=_command, args=(argv, str(cwd), env, str(out), str(err)))
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
    assert process.exitcode is not None
    return Done(process.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"))


def _command(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the command's directory, environment and output files, then the
    CLI's ``main``; the process exits with its code without running the server's exit hooks."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path, descriptor in ((out, 1), (err, 2)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, descriptor)
        os.close(opened)
    sys.argv = ["privzo", *argv]
    code = 1
    try:
        from privzo.cli.entry import main

        code = main(argv)
    except SystemExit as stop:  # argparse's errors and --help
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
