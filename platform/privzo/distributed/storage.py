"""Settings a Ray cluster of more than one node needs: storage and a tracking store that every
node reaches.

A run or search on a cluster has workers (Ray Train ranks, Tune trials) on other nodes. Ray
Train and Tune write checkpoints and results under the storage path from every node, and rank 0
or a trial logs to the tracking store from wherever it runs: a path on one node's local disk, or
an sqlite / file store there, is another empty directory on every other node. Ray would fail
late (a checkpoint that a restarted worker cannot find), or silently split the records across
nodes, so such settings are refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from privzo.section import ConfigError

# Filesystem types (as /proc/mounts names them) that every node of a cluster can mount.
SHARED_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "wekafs",
    "fuse.",  # gcsfuse, s3fs, juicefs, cephfs through FUSE, ...
)
MOUNTS = Path("/proc/mounts")
_LOCAL_TRACKING_SCHEMES = ("sqlite:", "file:")


def is_uri(path: str) -> bool:
    """A storage URI Ray reads through pyarrow (s3://, gs://, abfs://, hdfs://, ...)."""
    return "://" in path and not path.startswith("file://")


def mount_type(path: str, mounts: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (the longest mount point that is a
    prefix of it), from a ``/proc/mounts`` text; None when no line matches."""
    target = Path(path).expanduser().resolve()
    best: tuple[int, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if (target == point or point in target.parents) and (
            best is None or len(point.parts) > best[0]
        ):
            best = (len(point.parts), fields[2])
    return best[1] if best else None


def read_mounts() -> str | None:
    """This node's mount table, or None where there is none to read (not Linux)."""
    try:
        return MOUNTS.read_text()
    except OSError:
        return None


def is_shared_path(path: str, mounts: str | None) -> bool:
    """Whether every node can reach ``path``: a URI, or a path on a network filesystem. Without
    a mount table (not Linux) an explicit path is taken at its word."""
    if is_uri(path):
        return True
    path = path.removeprefix("file://")
    if mounts is None:
        return True
    kind = mount_type(path, mounts) or ""
    return any(
        kind == name or (name.endswith(".") and kind.startswith(name))
        for name in SHARED_FILESYSTEMS
    )


def is_local_tracking_store(uri: str | None) -> bool:
    """An MLflow store that lives in one node's files: the default (sqlite under the output
    root), an sqlite database, a file store or a plain path."""
    if uri is None:
        return True
    if uri.startswith("databricks"):  # 'databricks' or 'databricks://profile': a server
        return False
    return uri.startswith(_LOCAL_TRACKING_SCHEMES) or "://" not in uri


def cluster_storage_problems(
    nodes: int,
    storage_path: str,
    tracking_uri: str | None,
    *,
    storage_setting: str,
    mounts: str | None,
    tracking: bool = True,
    uri_allowed: bool = True,
) -> list[str]:
    """What a cluster of ``nodes`` nodes cannot run with: the storage path (named in messages
    as ``storage_setting``) and the tracking store (``tracking=False``: none is used). One node
    (a local Ray) needs nothing shared."""
    if nodes <= 1:
        return []
    problems = []
    if not is_shared_path(storage_path, mounts):
        uri = "a storage URI (s3://..., gs://...) or " if uri_allowed else ""
        problems.append(
            f"{storage_setting}={storage_path!r} is on this node's local disk; set it to "
            f"{uri}a path on storage every node mounts (NFS, Lustre, ...)"
        )
    if tracking and is_local_tracking_store(tracking_uri):
        shown = tracking_uri or "the default sqlite store under the output root"
        problems.append(
            f"tracking.uri={shown!r} is a store in this node's files; set tracking.uri to a "
            "tracking server every node reaches (http://HOST:5000, started with `mlflow "
            "server`), or tracking.backend=none"
        )
    return problems


def check_cluster_storage(
    nodes: int,
    storage_path: str,
    tracking_uri: str | None,
    *,
    storage_setting: str,
    tracking: bool = True,
    uri_allowed: bool = True,
    mounts: Callable[[], str | None] | None = None,
) -> None:
    """Refuse, before anything starts, settings a cluster of ``nodes`` nodes cannot work with
    (``mounts`` reads the mount table: this node's ``/proc/mounts`` by default)."""
    problems = cluster_storage_problems(
        nodes,
        storage_path,
        tracking_uri,
        storage_setting=storage_setting,
        mounts=(mounts or read_mounts)() if nodes > 1 else None,
        tracking=tracking,
        uri_allowed=uri_allowed,
    )
    if problems:
        raise ConfigError(
            f"the Ray cluster has {nodes} nodes, whose workers must all reach the run's files: "
            + "; ".join(problems)
        )


def alive_nodes() -> int:
    """Nodes of the connected Ray cluster (1 for a local Ray)."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))
