"""The process a command runs in: its cores and OpenMP waits, the libraries' log levels, which
file descriptor gets Ray's output, and SIGTERM. The library never touches these; commands do."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max ..."
REDELIVERY_DELAY_S = 0.05  # a lost Ctrl+C is sent again after this (redeliver_lost_interrupts)


def process_cores() -> int:
    """The cores this process may use: its CPU affinity (taskset, a container's cpuset), capped
    by its cgroup's CPU quota; the machine's count where neither can be read."""
    from privzo.threads import available_cores, cgroup_cpu_quota

    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:  # macOS and Windows have no affinity call
        affinity = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_quota(CGROUP_CPU_MAX.read_text())
    except OSError:
        quota = None
    return available_cores(affinity, quota)


def use_process_cores() -> int:
    """Size torch's pools to the cores available to this one process (a run, a study's cells
    one after another) and return the count."""
    from privzo.threads import use_threads

    cores = process_cores()
    use_threads(cores)
    return cores


def passive_openmp_waits() -> None:
    """Let torch's OpenMP threads sleep, not spin, while they wait for each other.

    OpenMP reads the policy once, when torch loads it, so this runs before any command imports
    torch; Ray workers started from this process inherit it. Spinning threads of several
    processes sharing a few cores starve each other (docs/measurements.md has the figures).
    A user's own OMP_WAIT_POLICY wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def quiet_libraries(verbose: bool) -> None:
    """Keep the console to privzo's progress and tables: silence the libraries' per-load bars,
    info logs and known noise, unless the user asked for them (``--verbose``)."""
    if verbose:
        return
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    # mlflow sets its own level when it is imported (lazily, at the first run): tell it first.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # Opacus and peft call this deprecated transformers property on every model they wrap
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    # Tune's automatic loggers add TensorBoard, which is not installed, and say so at every
    # search; a search passes its CSV and JSON loggers itself
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # DeepSpeed (imported by transformers' integrations) warns on every CPU-only machine; its
    # logger's level is set when it is imported, so a filter is what stays
    logging.getLogger("DeepSpeed").addFilter(
        lambda record: "Setting accelerator to CPU" not in record.getMessage()
    )
    # Ctrl+C inside an MLflow store call unwinds through SQLAlchemy's pool, which logs the
    # interrupted connection's reset with a traceback (the run is marked KILLED all the same);
    # the pool's loggers are per class below this one, so its level is what reaches them all
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    # a store that fails mid-run (a full disk) has MLflow log each failed query's SQL and
    # traceback; privzo's one line names the store and the reason
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # a local cluster turns token auth on by default and says so at every start
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send this process's file descriptor 1, and Python's ``sys.stdout`` (which need not be
    it, e.g. when a caller captures it), to stderr for a while: Ray forwards its workers' output
    to the one, DeepSpeed prints to the other, and a command's result on stdout must stay
    parsable."""
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or `kill` stopping the job), handled like Ctrl+C."""


def redeliver_lost_interrupts() -> None:
    """Deliver again a Ctrl+C (or SIGTERM) that landed in code whose exceptions Python ignores.

    A signal's KeyboardInterrupt is raised wherever the main thread is; inside a garbage
    collector callback or a ``__del__`` (SQLAlchemy's, MLflow's store's), Python only prints
    "Exception ignored" and goes on, so the command would keep training. The unraisable hook
    sends the same signal again from a thread a moment later, once the main thread is back in
    the command's own code (raised within the hook, it would be ignored too; a signal that lands
    in such code again is sent again)."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        kind = unraisable.exc_type
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            signum = signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT
            threading.Timer(REDELIVERY_DELAY_S, signal.raise_signal, (signum,)).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a run trains, SIGTERM stops it as Ctrl+C does: records kept, MLflow run KILLED."""

    def stop(_signum: int, _frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
