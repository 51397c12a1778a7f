"""What Ray's own processes print on a privzo run's console.

Ray Train v2 starts a detached ``PlacementGroupCleaner`` actor per run, which asks Ray's State
API every second whether the run's controller is alive. Where the State API is not served (a
local Ray started without its dashboard, as a search starts it, or a busy machine), every
question fails and the actor logs "Failed to query Ray Train Controller actor state" at WARNING
each time: dozens of lines per run that change nothing (the cleaner keeps monitoring and still
removes a dead run's placement group). Its logger lives in the actor's own process, so the
driver's logging settings cannot reach it; Ray runs the job's ``worker_process_setup_hook`` in
every worker process of the job, that actor's included.
"""

from __future__ import annotations

import logging

# Loggers of Ray's internals whose warnings are known to be noise for a privzo run; their
# errors still show.
NOISY_RAY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)

# The runtime env's ``worker_process_setup_hook`` value: imported in each worker from the
# privzo package the job ships (``py_modules``).
WORKER_SETUP_HOOK = f"{__name__}.quiet_ray_internals"


def quiet_ray_internals() -> None:
    """Raise the noisy Ray loggers to ERROR in this process (a Ray worker's setup hook)."""
    for name in NOISY_RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
