"""Which Ray a run or a search uses: the cluster named by ``--address`` or ``RAY_ADDRESS``, the
local head of the latest ``ray start --head`` on the machine, or a new local Ray.

The decision (``choose_cluster``) is made from what the caller found, not from Ray's error
text: the CLI reads ``RAY_ADDRESS`` and where ``ray start`` wrote its address (``RayTarget``);
the library reads no environment. Ray 2.60 has no public call for that address file (only
``ray._private.utils.read_ray_address``), so it is read here. A joined cluster keeps its own
CPU and GPU counts: Ray refuses ``num_cpus``/``num_gpus`` when joining.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.section import ConfigError

# where `ray start` writes the bootstrap address of the cluster it started, under Ray's temp dir
ADDRESS_FILE = Path("ray") / "ray_current_cluster"


class RayFailedError(OSError):
    """Ray did not start, or lost a worker the run allowed no restart for: the machine, not the
    config; the message says what to do. An OSError, so the CLI prints it in one line."""


def error_line(error: BaseException) -> str:
    """An error's type and the first line of its message (Ray's run to tracebacks)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


def address_file_under(temp_root: str | Path) -> Path:
    """The address file of the Ray whose temp root is ``temp_root`` (``RAY_TMPDIR``, else
    ``TMPDIR`` on Linux, else ``/tmp``: Ray's own order)."""
    return Path(temp_root) / ADDRESS_FILE


@dataclass(frozen=True)
class RayTarget:
    """What the caller found: ``--address``, the ``RAY_ADDRESS`` value, and the address file
    of the latest ``ray start`` (None: none looked for, a new local Ray is started)."""

    address: str | None = None
    env_address: str | None = None
    address_file: Path | None = None

    def file_text(self) -> str | None:
        path = self.address_file
        return path.read_text() if path is not None and path.is_file() else None


@dataclass(frozen=True)
class ClusterChoice:
    """Join ``address`` (found through ``source``), or start a local Ray (``address`` None)."""

    address: str | None
    source: str

    @property
    def joins(self) -> bool:
        return self.address is not None


def choose_cluster(
    address: str | None, env_address: str | None, file_text: str | None
) -> ClusterChoice:
    """``--address`` first, then ``RAY_ADDRESS``, then the latest ``ray start --head`` on the
    machine (its address file's text); else a new local Ray. ``local`` asks for a new one."""
    for value, source in ((address, "--address"), (env_address, "RAY_ADDRESS")):
        if value is not None and value.strip():
            value = value.strip()
            return ClusterChoice(None if value == "local" else value, source)
    if file_text is not None and file_text.strip():
        return ClusterChoice(file_text.strip(), "ray start --head")
    return ClusterChoice(None, "none running")


@dataclass(frozen=True)
class RayCluster:
    """The Ray this process uses, for the one line that says so."""

    choice: ClusterChoice
    cpus: float
    attached: bool = False  # a caller of the library had already started Ray

    def line(self) -> str:
        cpus = f"{self.cpus:g} CPU" + ("" if self.cpus == 1 else "s")
        if self.attached:
            return f"ray: using this process's Ray session ({cpus})"
        if self.choice.joins:
            return f"ray: joined the running cluster at {self.choice.address} ({cpus})"
        return f"ray: started a local cluster ({cpus})"


def connect_ray(
    target: RayTarget | None, runtime_env: dict[str, Any], num_cpus: int | None = None
) -> RayCluster:
    """Join the chosen cluster (with none of its resources restated) or start a local Ray with
    ``num_cpus`` (None: Ray counts the machine's). A Ray this process already runs is kept."""
    import ray

    target = target or RayTarget()
    choice = choose_cluster(target.address, target.env_address, target.file_text())
    if ray.is_initialized():
        return RayCluster(choice, _cpus(), attached=True)
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": True,
        "runtime_env": runtime_env,
    }
    if choice.joins:
        try:
            ray.init(address=choice.address, **options)
        except (ConnectionError, RuntimeError) as error:  # a crashed head leaves its file
            raise ConfigError(
                f"no Ray cluster answers at {choice.address} (from {choice.source}): start it "
                "(`ray start --head`; `ray stop` forgets a crashed one), name another with "
                f"--address, or pass --address local for a new local Ray ({error})"
            ) from None
    else:  # "local": Ray neither reads RAY_ADDRESS nor joins a `ray start` head
        _start_local_ray(num_cpus, options)
    return RayCluster(choice, _cpus())


def _start_local_ray(num_cpus: int | None, options: dict[str, Any]) -> None:
    """``ray.init`` of a new local Ray; its start failing (its processes not up in time on a
    loaded machine, no room for its session files) is one line saying what to do."""
    import ray

    try:
        ray.init(address="local", num_cpus=num_cpus, **options)
    except Exception as error:  # Ray raises several types, none of them its own
        raise RayFailedError(
            f"a local Ray did not start ({error_line(error)}); nothing was "
            "written: run the same command again (a loaded machine can delay Ray's processes), "
            "or start Ray yourself (`ray start --head`) and pass --address"
        ) from None


def _cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 0.0))
