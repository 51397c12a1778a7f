"""Which Ray a run or a search uses: ``--address``, then ``RAY_ADDRESS``, then the head of the
latest ``ray start --head`` (its address file), else a new local Ray; and the line saying so."""

from __future__ import annotations

import pytest

from privzo.distributed.cluster import (
    ClusterChoice,
    RayCluster,
    RayTarget,
    address_file_under,
    choose_cluster,
)


@pytest.mark.parametrize(
    ("address", "env_address", "file_text", "expected"),
    [
        (None, None, None, ClusterChoice(None, "none running")),
        (None, None, "", ClusterChoice(None, "none running")),
        (None, None, "10.0.0.5:6379\n", ClusterChoice("10.0.0.5:6379", "ray start --head")),
        (None, "10.0.0.7:6379", "10.0.0.5:6379", ClusterChoice("10.0.0.7:6379", "RAY_ADDRESS")),
        (
            "10.0.0.9:6379",
            "10.0.0.7:6379",
            "10.0.0.5:6379",
            ClusterChoice("10.0.0.9:6379", "--address"),
        ),
        ("local", "10.0.0.7:6379", "10.0.0.5:6379", ClusterChoice(None, "--address")),
        (None, "local", "10.0.0.5:6379", ClusterChoice(None, "RAY_ADDRESS")),
        ("  ", "", "10.0.0.5:6379", ClusterChoice("10.0.0.5:6379", "ray start --head")),
    ],
)
def test_the_cluster_is_chosen_in_ray_users_order(address, env_address, file_text, expected):
    assert choose_cluster(address, env_address, file_text) == expected


def test_the_address_file_is_read_where_ray_start_writes_it(tmp_path):
    target = RayTarget(address_file=address_file_under(tmp_path))
    assert target.address_file == tmp_path / "ray" / "ray_current_cluster"
    assert target.file_text() is None  # no `ray start` under this temp root
    target.address_file.parent.mkdir()
    target.address_file.write_text("127.0.0.1:6379")
    choice = choose_cluster(target.address, target.env_address, target.file_text())
    assert choice == ClusterChoice("127.0.0.1:6379", "ray start --head")


def test_the_line_names_the_cluster_used():
    joined = RayCluster(ClusterChoice("127.0.0.1:6379", "ray start --head"), 4.0)
    assert joined.line() == "ray: joined the running cluster at 127.0.0.1:6379 (4 CPUs)"
    started = RayCluster(ClusterChoice(None, "none running"), 2.0)
    assert started.line() == "ray: started a local cluster (2 CPUs)"
    kept = RayCluster(ClusterChoice(None, "none running"), 2.0, attached=True)
    assert kept.line() == "ray: using this process's Ray session (2 CPUs)"


def test_the_cli_looks_where_ray_start_writes_and_reads_ray_address(tmp_path, monkeypatch):
    from privzo.cli.arguments import ray_target

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    target = ray_target("10.0.0.9:6379")
    assert target == RayTarget("10.0.0.9:6379", "10.0.0.7:6379", address_file_under(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS")
    assert ray_target(None).env_address is None
