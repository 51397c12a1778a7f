"""Ray's own processes stay quiet on a privzo run's console.

Where Ray's State API is not served (a local Ray without its dashboard, as a search starts it,
or a busy machine), Ray Train's placement-group cleaner, a detached actor, logs "Failed to query
Ray Train Controller actor state" about once a second for as long as a run lasts. Whether the
State API answers depends on the machine, so the tests check the mechanism instead: the logger
privzo silences is the one that logs that message, and privzo's runtime env silences it in
every worker process of the job, detached actors included. The driver's own read of a run's
checkpoints drops Ray Train's "delete the folder" notice.
"""

from __future__ import annotations

import importlib
import inspect
import logging

import pytest

from privzo.distributed.console import NOISY_RAY_LOGGERS

NOISE = "Failed to query Ray Train Controller actor state"


def test_the_silenced_logger_is_the_one_that_logs_the_noise():
    # A Ray upgrade that moves the message to another module fails here, not on users' consoles.
    (name,) = NOISY_RAY_LOGGERS
    source = inspect.getsource(importlib.import_module(name))
    assert NOISE in source and "logging.getLogger(__name__)" in source


@pytest.mark.ray
def test_every_worker_process_of_the_job_silences_the_noisy_logger():
    import ray

    from privzo.distributed.launch import ray_runtime_env

    @ray.remote(num_cpus=0)
    class Probe:
        def level(self) -> int:
            return logging.getLogger(NOISY_RAY_LOGGERS[0]).getEffectiveLevel()

    assert not ray.is_initialized()
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=ray_runtime_env({}))
    try:
        detached = Probe.options(lifetime="detached", name="privzo-console-probe").remote()
        level = ray.get(detached.level.remote(), timeout=300)  # margin: a loaded machine
        ray.kill(detached)
    finally:
        ray.shutdown()
    assert level == logging.ERROR
    # A worker's default: the warning would show (so the assertion above can fail).
    assert logging.getLogger(NOISY_RAY_LOGGERS[0]).getEffectiveLevel() <= logging.WARNING


def test_reading_a_runs_checkpoints_drops_ray_trains_delete_the_folder_notice():
    """privzo reads a distributed run's committed checkpoints through Ray Train's result, whose
    checkpoint manager logs that a snapshot was found and to delete the folder for a new run."""
    from privzo.distributed.resume import SNAPSHOT_LOGGER, SNAPSHOT_NOTICE, snapshot_notice_dropped

    source = inspect.getsource(importlib.import_module(SNAPSHOT_LOGGER))
    assert SNAPSHOT_NOTICE in source and "logging.getLogger(__name__)" in source
    logger = logging.getLogger(SNAPSHOT_LOGGER)
    seen: list[str] = []
    handler = logging.Handler(logging.INFO)  # Ray's loggers do not propagate to the root's
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with snapshot_notice_dropped():
            logger.info(f"{SNAPSHOT_NOTICE} in storage folder at: 'x'")
            logger.info("another message")
        logger.info(f"{SNAPSHOT_NOTICE} outside privzo's read")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == ["another message", f"{SNAPSHOT_NOTICE} outside privzo's read"]
