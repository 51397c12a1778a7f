"""Several directions per step (DP-AggZO): the step, its estimators and its trajectory."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch

from privzo.zo.directions import DirectionSampler, direction_seeds, step_seed
from privzo.zo.estimators import MeanEstimator, make_estimator
from privzo.zo.integrity import columns_checksum
from privzo.zo.perturbation import InPlacePerturber
from privzo.zo.step import zo_step
from privzo.zo.sweeps import full_shards, sweep
from privzo.zo.trajectory import (
    EXTRA_COLUMNS,
    TrajectoryMeta,
    TrajectoryRecorder,
    format_columns,
    read_trajectory,
    replay_steps,
)

EXAMPLES = 5
SIZE = 40


def _setup(seed: int = 0):
    """θ of ``SIZE`` elements; example i's loss is a different smooth function of θ."""
    torch.manual_seed(seed)
    theta = torch.nn.Parameter(torch.randn(SIZE), requires_grad=False)
    perturber = InPlacePerturber(full_shards([("theta", theta)]), DirectionSampler("gaussian"))
    weights = torch.linspace(0.5, 2.0, EXAMPLES).unsqueeze(1)

    def losses(_batch):
        return (weights * (torch.sin(theta) + 0.5 * theta**2)).sum(dim=1)

    return theta, perturber, losses


def _step(perturber, losses, estimator, *, step=0, directions=1, rate=0.01, batch_size=EXAMPLES):
    return zo_step(
        step=step,
        seed=step_seed(5, step),
        perturber=perturber,
        batch=None,
        batch_size=batch_size,
        loss_fn=losses,
        estimator=estimator,
        learning_rate=rate,
        perturbation_scale=1e-3,
        directions=directions,
    )


def test_direction_seeds_start_with_the_step_seed_and_differ():
    seeds = direction_seeds(123, 8)
    assert seeds[0] == 123 and direction_seeds(123, 1) == [123]
    assert len(set(seeds)) == 8 and all(0 <= seed < 2**63 for seed in seeds)
    assert direction_seeds(123, 8) == seeds and direction_seeds(124, 8) != seeds


def test_one_direction_is_the_three_sweep_step_bit_for_bit():
    """K = 1 makes exactly +r, −2r, +(r − ηg·s) with g the batch mean (the single-direction
    step written out with the sweeps themselves)."""
    theta, perturber, losses = _setup()
    reference, reference_perturber, reference_losses = _setup()
    for step in range(4):
        record = _step(perturber, losses, MeanEstimator(), step=step)
        seed, shards = step_seed(5, step), reference_perturber.shards
        sampler = reference_perturber.sampler
        sweep(shards, sampler, seed, 1e-3)
        plus = reference_losses(None).float()
        sweep(shards, sampler, seed, -2e-3)
        minus = reference_losses(None).float()
        g = float(((plus - minus) / 2e-3).double().sum()) / EXAMPLES
        sweep(shards, sampler, seed, -0.01 * g * 1.0 - (-1e-3))  # restore fused
        assert record.projected_gradient == g and record.extra_projected_gradients == ()
        assert torch.equal(theta, reference)


def _direct_differences(theta, losses, seeds, radius=1e-3):
    """[B, K] differences from θ ± r·z_k computed on copies of θ (no sweeps)."""
    sampler = DirectionSampler("gaussian")
    columns = []
    base = theta.detach().clone()
    for seed in seeds:
        z = sampler.slice(seed, "theta", SIZE, 0, SIZE)
        theta.data.copy_(base + radius * z)
        plus = losses(None).float()
        theta.data.copy_(base - radius * z)
        minus = losses(None).float()
        columns.append((plus - minus) / (2 * radius))
    theta.data.copy_(base)
    return torch.stack(columns, dim=1)


def test_k_directions_estimate_and_update_match_a_direct_computation():
    theta, perturber, losses = _setup()
    seeds = direction_seeds(step_seed(5, 0), 3)
    expected = _direct_differences(theta, losses, seeds)
    base = theta.detach().clone()
    record = _step(perturber, losses, MeanEstimator(), directions=3, rate=0.05)
    assert record.projected_gradients == pytest.approx(
        expected.mean(dim=0).tolist(), abs=5e-3
    )  # fp32 losses ÷ 2ε
    sampler = DirectionSampler("gaussian")
    update = sum(
        g * sampler.slice(seed, "theta", SIZE, 0, SIZE)
        for g, seed in zip(record.projected_gradients, seeds, strict=True)
    )
    assert torch.allclose(theta, base - 0.05 / 3 * update, atol=1e-5)
    assert record.extra_direction_scales == (1.0, 1.0)


def test_private_estimator_clips_each_example_vector_to_l2_norm_c():
    estimator = make_estimator("gaussian", clip=1.0, noise_multiplier=0.5, expected_batch_size=4)
    differences = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0]])
    clipped = estimator.clip_each(differences)
    norms = torch.linalg.vector_norm(clipped, dim=1)
    assert norms.tolist() == pytest.approx([1.0, 0.5, 0.0, 1.0], abs=1e-6)
    assert float(norms.max()) <= 1.0 + 1e-12
    assert clipped[0].tolist() == pytest.approx([0.6, 0.8]) and clipped[
        1
    ].tolist() == pytest.approx([0.3, 0.4])
    assert clipped[3].tolist() == pytest.approx([-0.6, 0.8])
    # each coordinate: clipped sum / B plus its own noise of scale σC / B
    draws = torch.tensor([estimator.estimate(differences).projected_gradients for _ in range(4000)])
    center = clipped.sum(dim=0) / 4
    assert (draws.mean(dim=0) - center).abs().max() < 0.01
    assert draws.std(dim=0).tolist() == pytest.approx([0.5 / 4] * 2, rel=0.06)
    assert abs(float(torch.corrcoef(draws.T)[0, 1])) < 0.06  # independent draws


def _meta(directions: int) -> TrajectoryMeta:
    return TrajectoryMeta(
        1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace", directions=directions
    )


def test_k_direction_run_replays_bit_for_bit(tmp_path):
    theta, perturber, losses = _setup()
    base = theta.detach().clone()
    recorder = TrajectoryRecorder(_meta(4), release_batch_size=False)
    estimator = make_estimator("gaussian", clip=1.0, noise_multiplier=0.5, expected_batch_size=3)
    for step in range(12):
        recorder.append(
            _step(perturber, losses, estimator, step=step, directions=4, batch_size=step % 3)
        )
    recorder.write(tmp_path / "trajectory.parquet")
    table, meta = read_trajectory(tmp_path / "trajectory.parquet")
    assert meta == _meta(4) and meta.format_version == 2
    assert all(len(row) == 3 for row in table.column("extra_projected_gradients").to_pylist())
    replayed = torch.nn.Parameter(base.clone(), requires_grad=False)
    shards = full_shards([("theta", replayed)])
    assert replay_steps(InPlacePerturber(shards, DirectionSampler("gaussian")), table, meta) == 12
    assert torch.equal(replayed, theta) and not torch.equal(replayed, base)


def test_replay_probes_each_direction_at_the_points_training_evaluated():
    """MeZO with three directions: the probe's losses at θ_t ± r·z_k give back each released g_k
    (the batch mean of the differences), in the probe's order k = 0, 1, 2 with + before −."""
    theta, perturber, losses = _setup()
    base = theta.detach().clone()
    recorder = TrajectoryRecorder(_meta(3), release_batch_size=True)
    released = [_step(perturber, losses, MeanEstimator(), step=t, directions=3) for t in range(4)]
    for record in released:
        recorder.append(record)
    replayed = torch.nn.Parameter(base.clone(), requires_grad=False)
    weights = torch.linspace(0.5, 2.0, EXAMPLES).unsqueeze(1)
    probed: list[tuple[int, int, int, torch.Tensor]] = []

    def probe(row, direction, sign):  # the same loss as _setup's, on the replayed weights
        value = (weights * (torch.sin(replayed) + 0.5 * replayed**2)).sum(dim=1).float()
        probed.append((row["step"], direction, sign, value))

    shards = full_shards([("theta", replayed)])
    perturber = InPlacePerturber(shards, DirectionSampler("gaussian"))
    replay_steps(perturber, recorder.to_table(), _meta(3), at_perturbed=probe)
    order = [(step, k, sign) for step in range(4) for k in range(3) for sign in (1, -1)]
    assert [entry[:3] for entry in probed] == order
    for index, record in enumerate(released):
        for k, gradient in enumerate(record.projected_gradients):
            plus, minus = probed[index * 6 + 2 * k][3], probed[index * 6 + 2 * k + 1][3]
            difference = (plus - minus) / (2.0 * 1e-3)
            assert float(difference.double().mean()) == pytest.approx(gradient, rel=1e-9)


def test_replay_refuses_rows_with_the_wrong_number_of_directions(tmp_path):
    _theta, perturber, losses = _setup()
    recorder = TrajectoryRecorder(_meta(2), release_batch_size=True)
    recorder.append(_step(perturber, losses, MeanEstimator(), directions=2))
    table = recorder.to_table()
    meta = json.loads(table.schema.metadata[b"privzo"])
    meta["directions"] = 3
    metadata = {**table.schema.metadata, b"privzo": json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "edited.parquet")
    with pytest.raises(ValueError, match="its metadata changed"):
        read_trajectory(tmp_path / "edited.parquet")
    # a file from before the metadata's checksum existed: the rows' own check still refuses it
    del metadata[b"privzo.checksum.meta"]
    pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "edited.parquet")
    with pytest.raises(ValueError, match=r"2 projected gradients .* for 3 directions"):
        read_trajectory(tmp_path / "edited.parquet")


def _as_format_one(table, meta: TrajectoryMeta):
    """The table as the format-1 writer made it: its columns, no version, their checksum."""
    names = format_columns(1)
    old = table.select(names)
    fields = {k: v for k, v in meta.__dict__.items() if k not in ("directions", "format_version")}
    checksum = columns_checksum({name: old.column(name).to_pylist() for name in names})
    metadata = {b"privzo": json.dumps(fields).encode(), b"privzo.checksum": checksum.encode()}
    return old.replace_schema_metadata(metadata)


def test_a_format_one_trajectory_still_reads_and_replays(tmp_path):
    theta, perturber, losses = _setup()
    base = theta.detach().clone()
    recorder = TrajectoryRecorder(_meta(1), release_batch_size=True)
    for step in range(6):
        recorder.append(_step(perturber, losses, MeanEstimator(), step=step))
    old = _as_format_one(recorder.to_table(), _meta(1))
    assert not set(EXTRA_COLUMNS) & set(old.column_names)
    pq.write_table(old, tmp_path / "old.parquet")
    table, meta = read_trajectory(tmp_path / "old.parquet")
    assert meta.format_version == 1 and meta.directions == 1
    replayed = torch.nn.Parameter(base.clone(), requires_grad=False)
    shards = full_shards([("theta", replayed)])
    assert replay_steps(InPlacePerturber(shards, DirectionSampler("gaussian")), table, meta) == 6
    assert torch.equal(replayed, theta)
    # a resumed run puts the rows back and writes them in the current format
    recorder = TrajectoryRecorder(meta, release_batch_size=True)
    recorder.append_rows(table)
    recorder.write(tmp_path / "resumed.parquet")
    again, again_meta = read_trajectory(tmp_path / "resumed.parquet")
    assert again_meta.format_version == 2 and again.num_rows == 6


def test_a_newer_trajectory_format_is_refused(tmp_path):
    recorder = TrajectoryRecorder(_meta(1), release_batch_size=True)
    table = recorder.to_table()
    meta = {**json.loads(table.schema.metadata[b"privzo"]), "format_version": 99}
    metadata = {**table.schema.metadata, b"privzo": json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "new.parquet")
    with pytest.raises(ValueError, match="format 99; this privzo reads up to format 2"):
        read_trajectory(tmp_path / "new.parquet")
