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


class Command:
    """A started command: what a test needs of ``subprocess.Popen`` (poll, a signal, wait) for a
    command it stops at a moment of its choosing; the exit code of one killed by a signal is
    minus the signal's number, as Popen's is."""

    def __init__(self, process: multiprocessing.process.BaseProcess, out: Path, err: Path):
        self._process, self.out, self.err = process, out, err

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, signal: int) -> None:
        os.kill(self.pid, signal)

    def wait(self, timeout: float) -> int:
        """The exit code; a command still running after ``timeout`` seconds is killed (-9)."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
        assert self._process.exitcode is not None
        return self._process.exitcode

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


def start_cli(argv: list[str], cwd: Path, env: dict[str, str], logs: Path) -> Command:
    """Start ``privzo ARGV`` in ``cwd`` with ``env``; its output goes to ``logs``.stdout/.stderr
    files."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    out, err = logs.with_suffix(".stdout"), logs.with_suffix(".stderr")
    process = context.Process(target=_command, args=(argv, str(cwd), env, str(out), str(err)))
    process.start()
    return Command(process, out, err)


def run_cli(argv: list[str], cwd: Path, env: dict[str, str], logs: Path, timeout: float) -> Done:
    """Run ``privzo ARGV`` in ``cwd`` with ``env``; its output goes through ``logs``.stdout/.err
    files. A command still running after ``timeout`` seconds is killed (exit code -9)."""
    command = start_cli(argv, cwd, env, logs)
    code = command.wait(timeout)
    return Done(code, command.out.read_text(errors="replace"), command.stderr())


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
