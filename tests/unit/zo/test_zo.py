"""The zeroth-order engine: directions, sweeps, estimators, the step and trajectories."""

from __future__ import annotations

import copy
import itertools
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from privzo.zo.directions import (
    BLOCK_SIZE,
    DIRECTIONS_VERSION,
    GENERATORS,
    DirectionSampler,
    block_seed,
    resolve_generator,
    step_seed,
)
from privzo.zo.estimators import MeanEstimator, PrivateEstimator, make_estimator
from privzo.zo.integrity import (
    NonFiniteWeightsError,
    check_fingerprint,
    check_finite_weights,
    rounding_rtol,
    weights_fingerprint,
)
from privzo.zo.perturbation import InPlacePerturber, VirtualPerturber, make_perturber
from privzo.zo.philox import LANES, STREAM_DIRECTION, element_values, philox4x32, philox_key
from privzo.zo.step import StepRecord, zo_step
from privzo.zo.sweeps import ParameterShard, full_shards, sweep
from privzo.zo.trajectory import (
    TrajectoryMeta,
    TrajectoryRecorder,
    iter_rows,
    read_trajectory,
    replay_steps,
)

SIZE = 2 * BLOCK_SIZE + 1234  # three blocks, the last one partial


# Known-answer vectors of Philox-4x32-10 published with Random123 (kat_vectors): counter, key,
# output. The all-ones case makes every 32x32-bit product overflow int64's sign bit.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KAT)
def test_philox_matches_the_published_known_answers(counter, key, expected):
    words = philox4x32(tuple(torch.tensor([c], dtype=torch.int64) for c in counter), key)
    assert tuple(int(word) for word in words) == expected


def test_philox_elements_of_any_slice_are_generated_at_their_offsets():
    key = philox_key(3, "w")
    full = element_values(key, STREAM_DIRECTION, 0, 70_001, "normal", torch.device("cpu"))
    for start, stop in [(0, 1), (1, 6), (3, 70_001), (65_535, 65_541), (70_000, 70_001)]:
        piece = element_values(key, STREAM_DIRECTION, start, stop, "normal", torch.device("cpu"))
        assert torch.equal(piece, full[start:stop])
    other_stream = element_values(key, 1, 0, 70_001, "normal", torch.device("cpu"))
    assert not torch.equal(other_stream, full)
    assert full.dtype == torch.float32 and LANES == 4


def test_generator_defaults_by_device_and_rejects_unknown_names():
    assert resolve_generator("auto", "cpu") == "torch-blocks"
    assert resolve_generator("auto", "cuda") == "philox"
    assert resolve_generator("philox", "cpu") == "philox"
    with pytest.raises(ValueError, match="generator"):
        DirectionSampler("gaussian", generator="mt")


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("distribution", ["gaussian", "rademacher", "sphere"])
def test_direction_is_a_pure_function_of_seed_name_and_index(distribution, generator):
    sampler = DirectionSampler(distribution, generator=generator)
    full = sampler.slice(7, "layer.weight", SIZE, 0, SIZE)
    again = DirectionSampler(distribution, generator=generator).slice(
        7, "layer.weight", SIZE, 0, SIZE
    )
    assert torch.equal(full, again)
    for start, stop in [(0, 10), (5, BLOCK_SIZE + 3), (BLOCK_SIZE - 1, SIZE), (SIZE - 1, SIZE)]:
        assert torch.equal(sampler.slice(7, "layer.weight", SIZE, start, stop), full[start:stop])
    assert not torch.equal(full, sampler.slice(8, "layer.weight", SIZE, 0, SIZE))
    assert not torch.equal(full, sampler.slice(7, "layer.bias", SIZE, 0, SIZE))


@pytest.mark.parametrize("generator", GENERATORS)
def test_direction_distributions_have_the_right_moments(generator):
    gaussian = DirectionSampler("gaussian", generator=generator).slice(1, "w", SIZE, 0, SIZE)
    assert abs(gaussian.mean()) < 0.02 and abs(gaussian.std() - 1) < 0.02
    assert abs(float((gaussian.double() ** 4).mean()) - 3) < 0.1  # Gaussian kurtosis
    rademacher = DirectionSampler("rademacher", generator=generator).slice(1, "w", SIZE, 0, SIZE)
    assert set(rademacher.unique().tolist()) == {-1.0, 1.0}
    assert abs(float(rademacher.mean())) < 0.02
    sphere = DirectionSampler("sphere", generator=generator)
    scale = sphere.scale(1, [("w", SIZE), ("b", 10)])
    raw = torch.cat([sphere.slice(1, "w", SIZE, 0, SIZE), sphere.slice(1, "b", 10, 0, 10)])
    assert math.isclose(float((raw.double() * scale).norm()), math.sqrt(SIZE + 10), rel_tol=1e-9)


def test_seeds_spread_and_stay_in_int64():
    seeds = {step_seed(0, step) for step in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2**63 for s in seeds)
    assert block_seed(1, "a", 0) != block_seed(1, "a", 1) != block_seed(1, "b", 0)


def _split_shards(tensor: torch.Tensor, name: str, cuts: list[int]) -> list[ParameterShard]:
    """Shards of one flat parameter as a partitioned layout (ZeRO-3 style) would hold them."""
    flat = tensor.view(-1)
    bounds = [0, *cuts, flat.numel()]
    return [
        ParameterShard(name, flat[lo:hi], flat.numel(), offset=lo)
        for lo, hi in itertools.pairwise(bounds)
    ]


@pytest.mark.parametrize("generator", GENERATORS)
def test_sweep_is_independent_of_how_parameters_are_split(generator):
    base = torch.randn(SIZE)
    whole = base.clone()
    sampler = DirectionSampler("gaussian", generator=generator)
    sweep([ParameterShard("w", whole, SIZE)], sampler, 3, 0.5)
    pieces = base.clone()
    shards = _split_shards(pieces, "w", [100, BLOCK_SIZE + 7, SIZE - 5])
    sweep(shards, sampler, 3, 0.5)
    assert torch.equal(whole, pieces)
    assert not torch.equal(whole, base)


def test_in_place_perturbation_refuses_half_precision():
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        InPlacePerturber(full_shards(layer.named_parameters()), DirectionSampler("gaussian"))
    assert isinstance(
        make_perturber(layer, full_shards(layer.named_parameters()), DirectionSampler("gaussian")),
        VirtualPerturber,
    )


def _quadratic_setup(generator: str = "torch-blocks"):
    torch.manual_seed(0)
    theta = torch.nn.Parameter(torch.randn(50), requires_grad=False)
    sampler = DirectionSampler("gaussian", generator=generator)
    perturber = InPlacePerturber(full_shards([("theta", theta)]), sampler)

    def losses(_batch):
        return (torch.sin(theta) + 0.5 * theta**2).unsqueeze(0).sum(dim=1)

    return theta, perturber, losses


def test_zo_estimate_converges_to_the_directional_derivative():
    theta, perturber, losses = _quadratic_setup()
    z = perturber.sampler.slice(11, "theta", 50, 0, 50).double()
    true = float(((torch.cos(theta.double()) + theta.double()) * z).sum())
    errors = []
    for radius in (0.3, 0.1, 0.03):
        record = zo_step(
            step=0,
            seed=11,
            perturber=perturber,
            batch=None,
            batch_size=1,
            loss_fn=losses,
            estimator=MeanEstimator(),
            learning_rate=0.0,
            perturbation_scale=radius,
        )
        errors.append(abs(record.projected_gradient - true))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.01 * abs(true)  # O(ε²): 0.03² ≈ 1e-3 of the curvature


def test_step_with_zero_learning_rate_restores_the_weights_to_float32_rounding():
    """+εz, −2εz, +εz restores θ up to fp32 rounding (a few ulps), never more."""
    theta, perturber, losses = _quadratic_setup()
    before = theta.detach().clone()
    radius = 1e-3
    zo_step(
        step=0,
        seed=5,
        perturber=perturber,
        batch=None,
        batch_size=1,
        loss_fn=losses,
        estimator=MeanEstimator(),
        learning_rate=0.0,
        perturbation_scale=radius,
    )
    z = DirectionSampler("gaussian").slice(5, "theta", 50, 0, 50)
    ulp = torch.finfo(torch.float32).eps * (before.abs() + 2 * radius * z.abs())
    assert bool(((theta.detach() - before).abs() <= 3 * ulp).all())


def test_clipping_bounds_every_contribution():
    estimator = PrivateEstimator("gaussian", clip=0.5, noise_multiplier=1.0, expected_batch_size=4)
    differences = torch.tensor([0.1, -3.0, 1e9, -1e9, 0.2])
    clipped = estimator.clip_each(differences)
    assert clipped.abs().max() <= 0.5
    with_outlier = torch.cat([differences, torch.tensor([1e12])])
    change = estimator.clip_each(with_outlier).sum() - clipped.sum()
    assert abs(float(change)) <= 0.5


def test_nonfinite_differences_are_counted_and_contribute_zero():
    estimate = MeanEstimator().estimate(torch.tensor([1.0, float("nan"), float("inf"), 3.0]))
    assert estimate.nonfinite == 2
    assert estimate.projected_gradient == pytest.approx(1.0)  # (1 + 0 + 0 + 3) / 4


def test_private_noise_differs_between_runs_with_the_same_inputs():
    differences = torch.tensor([0.3, -0.2, 0.1])
    first = make_estimator("gaussian", clip=1.0, noise_multiplier=1.0, expected_batch_size=3)
    second = make_estimator("gaussian", clip=1.0, noise_multiplier=1.0, expected_batch_size=3)
    draws_first = [first.estimate(differences).projected_gradient for _ in range(5)]
    draws_second = [second.estimate(differences).projected_gradient for _ in range(5)]
    assert len(set(draws_first) | set(draws_second)) == 10


def test_private_estimate_divides_by_the_expected_batch_size():
    estimator = make_estimator("gaussian", clip=1.0, noise_multiplier=1e-12, expected_batch_size=8)
    estimate = estimator.estimate(torch.tensor([0.5, 2.0, -0.25]))
    assert estimate.projected_gradient == pytest.approx((0.5 + 1.0 - 0.25) / 8, abs=1e-9)
    assert estimator.estimate(torch.zeros(0)).batch_size == 0


def test_laplace_estimator_noise_scale():
    estimator = make_estimator("laplace", clip=2.0, noise_multiplier=1.5, expected_batch_size=1)
    draws = torch.tensor(
        [estimator.estimate(torch.zeros(0)).projected_gradient for _ in range(20000)]
    )
    # Laplace(b = σC = 3): mean |x| = b
    assert float(draws.abs().mean()) == pytest.approx(3.0, rel=0.05)


def test_unknown_mechanism_is_rejected():
    with pytest.raises(ValueError, match="mechanism='sgd' is unknown; allowed"):
        make_estimator("sgd", clip=1.0, noise_multiplier=1.0, expected_batch_size=1)


@pytest.mark.parametrize("generator", GENERATORS)
def test_trajectory_replay_reproduces_the_weights_bit_for_bit(tmp_path, generator):
    theta, perturber, losses = _quadratic_setup(generator)
    base = theta.detach().clone()
    meta = TrajectoryMeta(
        1e-3, "gaussian", "cpu", "full", {}, 0, "quadratic", "float32", "inplace", generator
    )
    recorder = TrajectoryRecorder(meta, release_batch_size=False)
    estimator = make_estimator("gaussian", clip=1.0, noise_multiplier=0.5, expected_batch_size=1)
    for step in range(30):
        recorder.append(
            zo_step(
                step=step,
                seed=step_seed(9, step),
                perturber=perturber,
                batch=None,
                batch_size=step % 3,  # some empty batches
                loss_fn=losses,
                estimator=estimator,
                learning_rate=0.01,
                perturbation_scale=1e-3,
            )
        )
    recorder.write(tmp_path / "trajectory.parquet")
    table, loaded_meta = read_trajectory(tmp_path / "trajectory.parquet")
    assert loaded_meta == meta
    assert table.column("batch_size").null_count == 30  # withheld in private runs
    replayed = base.clone()
    shards = full_shards([("theta", torch.nn.Parameter(replayed))])
    replay_steps(
        InPlacePerturber(shards, DirectionSampler("gaussian", generator=generator)), table, meta
    )
    assert torch.equal(replayed, theta.detach())
    assert not torch.equal(replayed, base)


def test_replay_refuses_another_directions_version_or_generator(tmp_path):
    _theta, perturber, losses = _quadratic_setup("philox")
    old = TrajectoryMeta(
        1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace", "philox", 1
    )
    recorder = TrajectoryRecorder(old, release_batch_size=True)
    recorder.append(
        zo_step(
            step=0,
            seed=1,
            perturber=perturber,
            batch=None,
            batch_size=1,
            loss_fn=losses,
            estimator=MeanEstimator(),
            learning_rate=0.01,
            perturbation_scale=1e-3,
        )
    )
    recorder.write(tmp_path / "old.parquet")
    table, meta = read_trajectory(tmp_path / "old.parquet")
    with pytest.raises(
        ValueError, match=f"version 1; this privzo draws version {DIRECTIONS_VERSION}"
    ):
        replay_steps(perturber, table, meta)
    current = TrajectoryMeta(1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace")
    with pytest.raises(ValueError, match="'torch-blocks' generator"):
        replay_steps(perturber, table, current)


def _tiny_half_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model.to(dtype).requires_grad_(False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_evaluates_perturbed_weights_without_drift(dtype):
    model = _tiny_half_model(dtype)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    perturber = make_perturber(
        model, full_shards(model.named_parameters()), DirectionSampler("gaussian")
    )
    inputs = torch.randn(4, 8).to(dtype)
    plain = model(inputs)
    for _ in range(50):  # many evaluations at ±εz, no update
        perturber.perturb(3, 0.05)
        plus = model(inputs)
        perturber.perturb(3, -0.05)
        minus = model(inputs)
        perturber.update(3, 0.0)
    assert not torch.equal(plus, minus) and not torch.equal(plus, plain)
    for name, parameter in model.named_parameters():  # θ never moved
        assert torch.equal(parameter, before[name]), name
    assert torch.equal(model(inputs), plain)


def test_half_precision_perturbed_forward_matches_explicit_weights():
    model = _tiny_half_model(torch.bfloat16)
    shards = full_shards(model.named_parameters())
    sampler = DirectionSampler("gaussian")
    perturber = make_perturber(model, shards, sampler)
    inputs = torch.randn(4, 8).to(torch.bfloat16)
    perturber.perturb(9, 0.1)
    virtual = model(inputs)
    perturber.update(9, 0.0)
    explicit = _tiny_half_model(torch.bfloat16)
    for shard, (_name, parameter) in zip(shards, explicit.named_parameters(), strict=True):
        z = sampler.slice(9, shard.name, shard.size, 0, shard.size)
        parameter.data.copy_((parameter.float() + 0.1 * z.view_as(parameter)).to(torch.bfloat16))
    assert torch.equal(virtual, explicit(inputs))


def _train_half_trajectory(tmp_path, dtype=torch.bfloat16):
    """Ten steps on a tiny bf16 MLP; its model and its trajectory as written and read back."""
    model = _tiny_half_model(dtype)
    perturber = make_perturber(
        model, full_shards(model.named_parameters()), DirectionSampler("gaussian")
    )
    meta = TrajectoryMeta(1e-2, "gaussian", "cpu", "full", {}, 0, "mlp", str(dtype)[6:], "virtual")
    recorder = TrajectoryRecorder(meta, release_batch_size=True)
    inputs = torch.randn(6, 8).to(dtype)
    for step in range(10):
        recorder.append(
            zo_step(
                step=step,
                seed=step_seed(1, step),
                perturber=perturber,
                batch=inputs,
                batch_size=6,
                loss_fn=lambda batch: model(batch).squeeze(-1) ** 2,
                estimator=MeanEstimator(),
                learning_rate=0.05,
                perturbation_scale=1e-2,
            )
        )
    recorder.write(tmp_path / "t.parquet")
    table, loaded_meta = read_trajectory(tmp_path / "t.parquet")
    return model, table, loaded_meta


def test_half_precision_update_rounds_once_and_replays(tmp_path):
    model, table, loaded_meta = _train_half_trajectory(tmp_path)
    fresh = _tiny_half_model(torch.bfloat16)
    fresh_perturber = make_perturber(
        fresh, full_shards(fresh.named_parameters()), DirectionSampler("gaussian")
    )
    replay_steps(fresh_perturber, table, loaded_meta)
    trained = dict(model.named_parameters())
    for name, parameter in fresh.named_parameters():
        assert torch.equal(parameter, trained[name]), name


def test_half_precision_trajectory_replays_into_its_intended_fp32_model(tmp_path):
    """``privzo replay --dtype float32``: the updates the run intended, without its roundings."""
    model, table, meta = _train_half_trajectory(tmp_path)
    intended = _tiny_half_model(torch.bfloat16).float()
    sampler = DirectionSampler("gaussian")
    shards = full_shards(intended.named_parameters())
    assert replay_steps(InPlacePerturber(shards, sampler), table, meta) == 10
    expected = _tiny_half_model(torch.bfloat16).float()
    start = {name: p.detach().clone() for name, p in expected.named_parameters()}
    for row in iter_rows(table):  # θ₀ + Σ −ηg·z in fp32, one step at a time
        coefficient = -row["learning_rate"] * row["projected_gradient"] * row["direction_scale"]
        sweep(full_shards(expected.named_parameters()), sampler, row["seed"], coefficient)
    trained = dict(model.named_parameters())
    for (name, parameter), wanted in zip(
        intended.named_parameters(), expected.parameters(), strict=True
    ):
        assert parameter.dtype == torch.float32
        assert torch.equal(parameter, wanted), name
        # the bf16 run's roundings are small next to how far training moved the weights
        # (measured: 0.4 % to 3.4 % on this model)
        moved = (parameter - start[name]).norm()
        rounding = (trained[name].float() - parameter).norm()
        assert 0 < rounding < 0.1 * moved, name


def test_replay_refuses_to_round_an_fp32_trajectory():
    meta = TrajectoryMeta(1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace")
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    virtual = make_perturber(
        layer, full_shards(layer.named_parameters()), DirectionSampler("gaussian")
    )
    table = TrajectoryRecorder(meta, release_batch_size=True).to_table()
    with pytest.raises(ValueError, match="perturbation"):
        replay_steps(virtual, table, meta)


def _recorded(tmp_path, rows: list[tuple[int, float, float]]):
    """A trajectory file with (step, projected gradient, learning rate) rows."""
    meta = TrajectoryMeta(1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace")
    recorder = TrajectoryRecorder(meta, release_batch_size=True)
    for step, gradient, rate in rows:
        recorder.append(StepRecord(step, step_seed(0, step), gradient, rate, 1, 1.0, 0, 0.0))
    path = tmp_path / "t.parquet"
    recorder.write(path)
    return path


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([(0, 0.1, 0.01), (1, 0.2, 0.01), (3, 0.1, 0.01)], r"row 2: step 3, expected 2"),
        ([(0, 0.1, 0.01), (0, 0.1, 0.01)], r"row 1: step 0, expected 1"),
        ([(0, 0.1, 0.01), (1, float("nan"), 0.01)], r"row 1: projected_gradient=nan"),
        ([(0, 1e30, 0.01)], r"row 0: the step's update"),
    ],
)
def test_replay_refuses_rows_no_run_writes(tmp_path, rows, message):
    path = _recorded(tmp_path, rows)
    with pytest.raises(ValueError, match=message):
        read_trajectory(path)


def test_replay_refuses_a_trajectory_whose_rows_changed(tmp_path):
    path = _recorded(tmp_path, [(0, 0.1, 0.01), (1, 0.2, 0.01)])
    table = pq.read_table(path)
    gradients = table.column("projected_gradient").to_pylist()
    gradients[1] = 0.25  # an edit that keeps every row plausible
    index = table.schema.get_field_index("projected_gradient")
    edited = table.set_column(index, "projected_gradient", pa.array(gradients, pa.float64()))
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(ValueError, match="fails its checksum"):
        read_trajectory(path)


def test_a_base_fingerprint_matches_across_dtypes_but_not_other_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    fingerprint = weights_fingerprint(model.named_parameters())
    as_bf16 = weights_fingerprint(copy.deepcopy(model).to(torch.bfloat16).named_parameters())
    check_fingerprint(fingerprint, as_bf16, "b", rtol=rounding_rtol("float32", "bfloat16"))
    with pytest.raises(ValueError, match="other values"):  # rounded, but called the same dtype
        check_fingerprint(fingerprint, as_bf16, "b", rtol=0.0)
    other = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    with pytest.raises(ValueError, match=r"tensor '0\.weight' differs"):
        check_fingerprint(fingerprint, weights_fingerprint(other.named_parameters()), "other")
    wider = torch.nn.Sequential(model[0], torch.nn.Linear(64, 3))  # same first layer
    with pytest.raises(ValueError, match=r"'1\.weight' differs"):
        check_fingerprint(fingerprint, weights_fingerprint(wider.named_parameters()), "wider")
    with pytest.raises(ValueError, match="its tensors differ"):
        check_fingerprint(fingerprint, weights_fingerprint(model[:1].named_parameters()), "part")


def test_a_base_with_every_weight_moved_is_refused_by_its_kept_values():
    """0.3 % noise on every weight keeps each tensor's statistics within their tolerance; the
    kept values see it. A fingerprint from before kept values existed is checked as it was."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    fingerprint = weights_fingerprint(model.named_parameters())
    check_fingerprint(fingerprint, weights_fingerprint(model.named_parameters()), "same")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1 + 3e-3 * torch.randn_like(parameter))
    moved = weights_fingerprint(model.named_parameters())
    statistics_only = {name: entry[:3] for name, entry in fingerprint.items()}
    check_fingerprint(statistics_only, moved, "moved")  # the statistics alone pass
    with pytest.raises(ValueError, match=r"'0\.weight' has the run's shape and statistics"):
        check_fingerprint(fingerprint, moved, "moved")


def test_replay_refuses_a_trajectory_whose_metadata_changed(tmp_path):
    path = _recorded(tmp_path, [(0, 0.1, 0.01), (1, 0.2, 0.01)])
    table = pq.read_table(path)
    stored = dict(table.schema.metadata)
    meta = json.loads(stored[b"privzo"])
    meta["perturbation_scale"] = 1.001e-3  # moves every replayed weight a little
    stored[b"privzo"] = json.dumps(meta).encode()
    pq.write_table(table.replace_schema_metadata(stored), path)
    with pytest.raises(ValueError, match="its metadata changed"):
        read_trajectory(path)


def test_replay_refuses_a_trajectory_whose_checksum_was_removed(tmp_path):
    path = _recorded(tmp_path, [(0, 0.1, 0.01), (1, 0.2, 0.01)])
    table = pq.read_table(path)
    gradients = table.column("projected_gradient").to_pylist()
    gradients[1] = 0.25
    index = table.schema.get_field_index("projected_gradient")
    edited = table.set_column(index, "projected_gradient", pa.array(gradients, pa.float64()))
    stored = {k: v for k, v in table.schema.metadata.items() if not k.startswith(b"privzo.")}
    pq.write_table(edited.replace_schema_metadata(stored), path)
    with pytest.raises(ValueError, match="has no checksum"):
        read_trajectory(path)


def test_every_single_byte_flip_reads_or_gets_privzos_message(tmp_path):
    """A damaged file never reaches the user as Arrow's (or JSON's) exception."""
    rows = [(step, 0.1 * (step + 1), 0.01) for step in range(4)]
    path = _recorded(tmp_path, rows)
    original = path.read_bytes()
    damaged = tmp_path / "damaged.parquet"
    refused = 0
    for position in range(len(original)):
        flipped = bytearray(original)
        flipped[position] ^= 0x5A
        damaged.write_bytes(bytes(flipped))
        try:
            table, _meta = read_trajectory(damaged)
        except ValueError as error:
            assert not isinstance(error, pa.ArrowException), (position, error)
            assert "trajectory" in str(error) or "privzo" in str(error), (position, error)
            refused += 1
            continue
        # a flip the checks let through left what replay reads unchanged
        assert table.column("projected_gradient").to_pylist() == [
            0.1,
            0.2,
            0.30000000000000004,
            0.4,
        ]
    assert refused > len(original) // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_finite_weights_check_finds_any_nonfinite_element(dtype, bad):
    """Found from each weight's extremes, in any position, beside finite and empty weights (a
    ZeRO-3 rank's partition of a small parameter can be empty)."""
    finite = [("empty", torch.zeros(0, dtype=dtype)), ("ok", torch.randn(4, 5).to(dtype))]
    check_finite_weights(finite, steps=1)
    for position in (0, 7, 19):
        weight = torch.randn(4, 5).to(dtype)
        weight.view(-1)[position] = bad
        with pytest.raises(NonFiniteWeightsError, match="weights of 'w'"):
            check_finite_weights([*finite, ("w", weight)], steps=1)
