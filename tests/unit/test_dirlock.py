"""One run per output directory: the lock is real (other processes hold it, one is killed),
and every refusal comes before any model is loaded."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO
from privzo.config import ConfigError
from privzo.dirlock import LOCK_FILE, DirectoryLock, DirectoryLockedError
from privzo.run import run

# A short non-private run (at privzo's default learning rate and ε, which it ignores).
LOCK_RUN = (
    "optimizer.steps=6",
    "optimizer.algorithm=mezo",
    "privacy.sampler=shuffle",
    "tracking.log_every=3",
    "optimizer.learning_rate=1e-4",
    "privacy.epsilon=2",
)


def _holder_process(directory: Path) -> subprocess.Popen:
    """A process that holds ``directory``'s lock until its stdin closes (or it is killed)."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from privzo.dirlock import DirectoryLock
        with DirectoryLock(Path({str(directory)!r})):
            print("held", flush=True)
            sys.stdin.read()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "held"
    return process


def _release(process: subprocess.Popen) -> None:
    process.stdin.close()
    assert process.wait(timeout=60) == 0


def test_a_run_takes_over_the_stale_lock_of_a_killed_process(tmp_path, tiny_run_config, cache_dir):
    """A process killed without cleanup (SIGKILL) leaves its lock file behind; a run into its
    directory takes it over. (A second run refused while a first one trains is in
    ``test_interrupt.py``, on the command that test stops.)"""
    output = tmp_path / "runs" / "shared"
    holder = _holder_process(output)
    holder.kill()
    holder.wait(timeout=60)
    assert json.loads((output / LOCK_FILE).read_text())["pid"] == holder.pid
    summary = run(
        tiny_run_config(*LOCK_RUN), output, cache_dir=cache_dir, progress=False, overwrite=True
    )
    assert summary["steps"] == 6
    assert not (output / LOCK_FILE).exists()


def test_a_lock_held_by_another_process_refuses_before_loading(tmp_path, tiny_run_config):
    """The refusal comes first: the model (a directory that does not exist) is never read."""
    output = tmp_path / "out"
    holder = _holder_process(output)
    try:
        config = tiny_run_config(*LOCK_RUN, f"model.name_or_path={tmp_path / 'no-such-model'}")
        with pytest.raises(DirectoryLockedError, match=rf"PID {holder.pid} on host"):
            run(config, output, cache_dir=tmp_path / "cache", progress=False)
        assert not (tmp_path / "cache").exists()
    finally:
        _release(holder)
    assert not output.exists()  # the holder removed its lock file and the directory it made


def test_a_distributed_run_holds_the_lock_in_its_driver(tmp_path, tiny_run_config):
    output = tmp_path / "out"
    holder = _holder_process(output)
    try:
        config = tiny_run_config(*LOCK_RUN, "parallel.strategy=replica", "parallel.workers=2")
        with pytest.raises(DirectoryLockedError, match=rf"PID {holder.pid}"):
            run(config, output, cache_dir=tmp_path / "cache", progress=False)
    finally:
        _release(holder)


def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    holder = _holder_process(tmp_path / "out")
    holder.kill()  # SIGKILL: no cleanup, the file names a dead process
    holder.wait(timeout=60)
    assert json.loads((tmp_path / "out" / LOCK_FILE).read_text())["pid"] == holder.pid
    with (
        caplog.at_level(logging.WARNING, logger="privzo.dirlock"),
        DirectoryLock(tmp_path / "out"),
    ):
        written = json.loads((tmp_path / "out" / LOCK_FILE).read_text())
        assert written == {"pid": os.getpid(), "host": socket.gethostname()}
    assert f"stale lock of PID {holder.pid}" in caplog.text
    assert not (tmp_path / "out" / LOCK_FILE).exists()


def test_a_lock_file_of_a_live_process_is_not_taken(tmp_path):
    """A live PID on this host whose flock is free (a reused PID, or a file system without
    flock) is not ours to take: refused, with how to clear it."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(
            json.dumps({"pid": sleeper.pid, "host": socket.gethostname()})
        )
        with pytest.raises(DirectoryLockedError, match=rf"PID {sleeper.pid} .* still alive"):
            DirectoryLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait(timeout=60)
    with DirectoryLock(tmp_path):  # dead now: stale
        pass


def test_the_lock_is_released_after_an_exception(tmp_path, tiny_run_config, cache_dir):
    """A run failing inside the lock (a missing model, found after the lock is taken) leaves
    no lock behind: another process can take it at once."""
    output = tmp_path / "out"
    output.mkdir()
    config = tiny_run_config(*LOCK_RUN, f"model.name_or_path={tmp_path / 'no-such-model'}")
    with pytest.raises(ConfigError, match="no-such-model"):
        run(config, output, cache_dir=cache_dir, progress=False)
    assert not (output / LOCK_FILE).exists()
    _release(_holder_process(output))


def test_a_refused_run_leaves_no_directory_behind(tmp_path, tiny_run_config, cache_dir):
    output = tmp_path / "a" / "b" / "out"
    config = tiny_run_config(*LOCK_RUN, f"model.name_or_path={tmp_path / 'no-such-model'}")
    with pytest.raises(ConfigError):
        run(config, output, cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "a").exists()


def test_the_cli_names_the_holder(tmp_path, sentiment_files, capsys):
    from privzo.cli import main

    output = tmp_path / "out"
    holder = _holder_process(output)
    try:
        code = main(["run", str(REPO / "configs/runs/tiny-mezo.yaml"), "--output-dir", str(output)])
    finally:
        _release(holder)
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("privzo: error: --output-dir") and f"PID {holder.pid}" in error
