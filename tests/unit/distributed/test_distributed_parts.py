"""The distribution seam without Ray: samplers' shares and all-reducing estimators on a real
two-process gloo group (torch.multiprocessing, a file store in a temp dir)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from privzo.distributed.collectives import WorkerGroup
from privzo.distributed.estimators import ReplicaPrivateEstimator, distribute_estimator
from privzo.distributed.sampling import PartitionedPoissonSampler, StridedShuffleSampler
from privzo.layouts.config import ParallelConfig
from privzo.privacy.accountants.numeric import LmoNoise
from privzo.privacy.mechanisms import LmoMechanism
from privzo.privacy.sampling import ShuffleSampler
from privzo.zo.estimators import make_estimator


def test_strided_shares_make_up_the_single_process_batch():
    single = ShuffleSampler(50, 8, seed=3)
    shares = [StridedShuffleSampler(50, 8, 3, WorkerGroup(rank, 3)) for rank in range(3)]
    for _ in range(20):  # crosses epochs (50 // 8 = 6 batches each)
        batch = single.next_batch()
        parts = [sampler.next_batch() for sampler in shares]
        assert sorted(np.concatenate(parts).tolist()) == sorted(batch.tolist())
        assert [len(part) for part in parts] == [3, 3, 2]


def test_poisson_partitions_are_disjoint_and_cover_the_data():
    samplers = [PartitionedPoissonSampler(11, 1.0, WorkerGroup(rank, 3)) for rank in range(3)]
    batches = [sampler.next_batch() for sampler in samplers]
    assert sorted(np.concatenate(batches).tolist()) == list(range(11))
    assert all(set(batch % 3) == {rank} for rank, batch in enumerate(batches))
    assert samplers[0].expected_batch_size == 11.0  # the global expectation p·N


def test_poisson_shares_are_truncated_at_the_global_bound():
    groups = [WorkerGroup(rank, 2) for rank in range(2)]
    samplers = [PartitionedPoissonSampler(40, 1.0, group, max_batch_size=5) for group in groups]
    for rank, sampler in enumerate(samplers):
        batch = sampler.next_batch()  # 20 drawn from each partition, 5 kept
        assert len(batch) == 5 and set(batch % 2) == {rank}


def test_poisson_shares_sample_each_example_at_rate_p():
    samplers = [PartitionedPoissonSampler(40, 0.25, WorkerGroup(rank, 2)) for rank in range(2)]
    counts = np.zeros(40)
    for _ in range(2000):
        for sampler in samplers:
            counts[sampler.next_batch()] += 1
    rates = counts / 2000  # each ~ Binomial(2000, 0.25) / 2000: sd ~ 0.0097
    assert np.all(np.abs(rates - 0.25) < 0.05)


def test_the_distributed_estimator_keeps_the_lmo_noise_parameters():
    """A replica / zero3 rank rebuilds the run's estimator; an LMO mechanism must come back with
    the configured mixture, not fail (nor fall back to other parameters) inside the workers."""
    parameters: dict[str, Any] = {
        "weights": [0.2, 0.5, 0.3],
        "gamma_shape": 4.0,
        "gamma_scale": 0.25,
        "exponential_rate": 2.0,
        "uniform_low": 0.75,
        "uniform_high": 1.25,
    }
    single = make_estimator(
        "lmo",
        clip=1.0,
        noise_multiplier=2.0,
        expected_batch_size=4,
        noise_parameters=parameters,
    )
    twin = distribute_estimator(single, WorkerGroup(0, 1))
    assert isinstance(twin, ReplicaPrivateEstimator)
    assert isinstance(twin.mechanism, LmoMechanism)
    assert twin.noise_parameters == parameters
    assert twin.mechanism.noise == LmoNoise(**parameters)
    assert np.isfinite(twin.estimate(torch.zeros(3)).projected_gradient)


def test_the_distributed_estimator_keeps_the_gridded_vectors_directions():
    """A rank's twin of a gridded K = 4 estimator rounds to the same squared-norm bound N the
    accountant was given, and refuses a step of another width."""
    parameters = {"grid": 1024, "directions": 4}
    single = make_estimator(
        "gaussian",
        clip=1.0,
        noise_multiplier=1.3,
        expected_batch_size=4,
        noise_parameters=parameters,
    )
    twin = distribute_estimator(single, WorkerGroup(0, 1))
    assert twin.noise_parameters == parameters
    assert twin.vector_bound == single.vector_bound is not None
    assert len(twin.estimate(torch.ones(3, 4)).projected_gradients) == 4
    with pytest.raises(AssertionError):
        twin.estimate(torch.ones(3, 2))


def _worker(rank: int, store_path: str, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    group = WorkerGroup.current()
    differences = torch.arange(10, dtype=torch.float32) / 3 - 1  # the global batch
    local = differences[rank::2]
    mean = distribute_estimator(make_estimator(), group).estimate(local)
    private = distribute_estimator(
        make_estimator("gaussian", clip=1.0, noise_multiplier=2.0, expected_batch_size=5),
        group,
    )
    # zero differences: g is pure noise / 5, so Var(5g) = (σC)² if the noise is drawn once
    noise = [private.estimate(torch.zeros(2)).projected_gradient * 5 for _ in range(3000)]
    reduced_bytes = group.reduced_bytes
    # local sums 1 and 2: what each rank receives from the all-reduce (the plain sum is 3)
    received = [private.aggregate([float(rank + 1)], 1)[0][0] for _ in range(20)]
    # two directions: each rank's [5, 2] share of the global [10, 2] differences
    columns = torch.stack([differences, differences.flip(0) * 2], dim=1)
    pair = distribute_estimator(make_estimator(), group).estimate(columns[rank::2])
    results[rank] = (
        mean.projected_gradient,
        mean.batch_size,
        noise,
        reduced_bytes,
        received,
        pair.projected_gradients,
    )
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    store = tmp_path_factory.mktemp("gloo") / "store"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(str(store), results), nprocs=2, join=True)
        return dict(results)


@pytest.mark.slow  # two spawned processes that import torch
def test_distributed_mean_is_the_single_process_mean(two_ranks):
    differences = torch.arange(10, dtype=torch.float32) / 3 - 1
    single = make_estimator().estimate(differences)
    columns = torch.stack([differences, differences.flip(0) * 2], dim=1)
    single_pair = make_estimator().estimate(columns).projected_gradients
    for rank in (0, 1):
        mean, count, _noise, _bytes, _received, pair = two_ranks[rank]
        assert count == 10
        assert mean == pytest.approx(single.projected_gradient, rel=1e-12, abs=1e-12)
        assert pair == pytest.approx(single_pair, rel=1e-12, abs=1e-12)


@pytest.mark.slow  # two spawned processes that import torch
def test_noise_is_drawn_once_and_shared(two_ranks):
    noise_0, noise_1 = two_ranks[0][2], two_ranks[1][2]
    assert noise_0 == noise_1  # every rank applies the same g
    variance = float(np.var(noise_0))
    # (σC)² = 4 once; two draws would give 8. 3000 samples: the estimate's sd is ~0.1
    assert 3.5 < variance < 4.5


@pytest.mark.slow  # two spawned processes that import torch
def test_payload_is_a_few_fp64_scalars_per_step(two_ranks):
    # one mean step ([sum, count]) and 3000 private steps ([noisy sum, count]) in fp64
    assert two_ranks[0][3] == 2 * 8 + 3000 * 2 * 8


@pytest.mark.slow  # two spawned processes that import torch
def test_no_rank_receives_the_sum_without_noise(two_ranks):
    """Rank 0 adds its draw to its local sum before the all-reduce, so the sum every rank
    receives is already noised (σC = 2: a draw within 1e-9 of 0 has probability ~1e-9)."""
    received_0, received_1 = two_ranks[0][4], two_ranks[1][4]
    assert received_0 == received_1
    assert all(abs(total - 3.0) > 1e-9 for total in received_0)


def test_a_new_run_never_continues_an_old_ray_run(tmp_path):
    """Ray Train resumes a run whose name it finds in storage: each new run names its Ray run
    anew (only the same run's later launches reuse the name, from its resume point), and
    preparing an overwritten directory removes the old run's Ray state (its checkpoints hold
    that run's noised steps)."""
    from privzo.distributed.launch import ray_run_name
    from privzo.rundir import RAY_STATE_DIR, prepare_output_dir

    output = tmp_path / "run"
    names = {ray_run_name(output) for _ in range(20)}
    assert len(names) == 20 and all(name.startswith("run-") for name in names)
    old = output / RAY_STATE_DIR / "run-0123abcd" / "checkpoint_2026-01-01_00-00-00.000000"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    prepare_output_dir(output)
    assert output.is_dir() and not (output / RAY_STATE_DIR).exists()


def test_checkpoints_ray_does_not_keep_are_removed(tmp_path):
    """A killed launch's upload Ray never committed (and anything else Ray does not keep) is
    deleted; the committed checkpoints and Ray's own files stay."""
    from privzo.distributed.resume import committed, remove_uncommitted

    run_path = tmp_path / "ray" / "run-0123abcd"
    for name in ("checkpoint_1", "checkpoint_2", "checkpoint_3"):
        (run_path / name).mkdir(parents=True)
        (run_path / name / "state.json").write_text("{}")
    (run_path / "checkpoint_manager_snapshot.json").write_text("{}")
    kept = frozenset({str(run_path / "checkpoint_2"), str(run_path / "checkpoint_3") + "/"})
    remove_uncommitted(str(run_path), kept)
    left = sorted(path.name for path in run_path.iterdir())
    assert left == ["checkpoint_2", "checkpoint_3", "checkpoint_manager_snapshot.json"]
    remove_uncommitted(str(tmp_path / "ray" / "never-launched"), frozenset())  # nothing there
    assert committed(str(tmp_path / "ray" / "never-launched")).steps == 0


def test_checkpoints_are_named_by_their_step():
    """Ray Train names a checkpoint by the time of its report, so two kept ones would time a
    window: names come from the step instead, sort in step order and keep the prefix by which
    uncommitted ones are found and removed."""
    from privzo.distributed.resume import CHECKPOINT_PREFIX
    from privzo.distributed.worker import checkpoint_name

    names = [checkpoint_name(steps) for steps in (5, 40, 800, 75000)]
    assert names[0] == "checkpoint_000000005"
    assert sorted(names) == names and all(name.startswith(CHECKPOINT_PREFIX) for name in names)


# A node's mount table: a local disk, a RAM disk and an NFS share every node mounts.
MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
nfs-server:/export /shared nfs4 rw,vers=4.2 0 0
gcsfuse /buckets/runs fuse.gcsfuse rw 0 0
"""


@pytest.mark.parametrize(
    ("nodes", "storage", "uri", "refused"),
    [
        (1, "/tmp/run/ray", None, []),  # a local Ray: nothing needs sharing
        (2, "/shared/runs/x", "http://tracking:5000", []),
        (2, "s3://bucket/runs", "https://tracking.example", []),
        (2, "/buckets/runs/x", "databricks", []),
        (2, "/tmp/run/ray", "http://tracking:5000", ["parallel.storage_path='/tmp/run/ray'"]),
        (3, "/home/me/run", "http://tracking:5000", ["parallel.storage_path='/home/me/run'"]),
        (2, "file:///tmp/ray", "http://h:5000", ["parallel.storage_path='file:///tmp/ray'"]),
        (2, "/shared/runs/x", None, ["the default sqlite store"]),
        (2, "/shared/runs/x", "sqlite:////shared/mlflow.db", ["sqlite:////shared/mlflow.db"]),
        (2, "/shared/runs/x", "/shared/mlruns", ["tracking.uri='/shared/mlruns'"]),
        (2, "/tmp/x", "file:///tmp/mlruns", ["storage_path='/tmp/x'", "file:///tmp/mlruns"]),
    ],
)
def test_a_cluster_needs_shared_storage_and_a_tracking_server(nodes, storage, uri, refused):
    from privzo.distributed.storage import cluster_storage_problems

    problems = cluster_storage_problems(
        nodes, storage, uri, storage_setting="parallel.storage_path", mounts=MOUNTS
    )
    assert len(problems) == len(refused)
    for problem, named in zip(problems, refused, strict=True):
        assert named in problem
    assert all("s3://" in p or "tracking server" in p for p in problems)


def test_a_cluster_without_tracking_or_a_mount_table_needs_only_what_it_can_check():
    from privzo.distributed.storage import cluster_storage_problems

    local_store = cluster_storage_problems(
        2, "/shared/x", None, storage_setting="s", mounts=MOUNTS, tracking=False
    )
    assert local_store == []  # tracking.backend=none: no store to share
    assert cluster_storage_problems(2, "/tmp/x", "http://h", storage_setting="s", mounts=None) == []


def test_a_distributed_run_on_two_nodes_with_local_files_is_refused_before_it_starts(
    tmp_path, cache_dir, monkeypatch
):
    """The launcher's own check, with Ray reporting two nodes: refused naming the settings to
    change, before the output directory or the tracking store exist."""
    from privzo.config import ConfigError, load_config
    from privzo.distributed import launch, storage
    from privzo.run import run

    monkeypatch.setattr(
        launch, "_init_ray", lambda config, cluster: None
    )  # no Ray needed to refuse
    monkeypatch.setattr(launch, "alive_nodes", lambda: 2)
    monkeypatch.setattr(storage, "read_mounts", lambda: MOUNTS)
    config = load_config(
        None,
        [
            "model.name_or_path=tiny-opt",
            "task.builtin_dataset=demo-sentiment",
            "optimizer.steps=4",
            "parallel.strategy=replica",
            "parallel.workers=2",
        ],
    )
    output = tmp_path / "runs" / "two-nodes"
    with pytest.raises(ConfigError, match="2 nodes") as refused:
        run(config, output, cache_dir=cache_dir, progress=False)
    assert "parallel.storage_path=" in str(refused.value)
    assert "set tracking.uri to a tracking server" in str(refused.value)
    assert not output.exists() and not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_the_deepspeed_config_offloads_the_partitions_where_asked(offload):
    from privzo.distributed.zero3 import deepspeed_config, init_config

    parallel = ParallelConfig(strategy="zero3", offload=offload)
    zero = deepspeed_config(parallel)["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_param_persistence_threshold"] == 0
    if offload == "none":
        assert "offload_param" not in zero
    else:  # host memory, pinned only where a GPU copies from it
        assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
        pinned = ParallelConfig(strategy="zero3", offload="cpu", use_gpu=True)
        assert deepspeed_config(pinned)["zero_optimization"]["offload_param"]["pin_memory"]
    loading = init_config("bfloat16", parallel)
    assert loading["zero_optimization"] == zero and loading["bf16"] == {"enabled": True}
