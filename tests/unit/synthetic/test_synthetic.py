"""The synthetic quadratic study (DPZero §5.1): config validation, the algorithms' clipping and
noise, and the study's headline at a small size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from privzo.config import ConfigError
from privzo.privacy import calibrate_noise_multiplier
from privzo.synthetic import build_synthetic_config, load_synthetic_config, run_synthetic_study
from privzo.synthetic.algorithms import (
    ALGORITHMS,
    SecretNormal,
    StepInputs,
    clip_scalars,
    dpgd0th_clipped_scalars,
    dpgd_clip_factors,
    finite_differences,
    run_algorithm,
)
from privzo.synthetic.config import ALGORITHM_NAMES, PATTERN_NAMES
from privzo.synthetic.quadratic import EFFECTIVE_RANK_PATTERNS, make_problem
from privzo.synthetic.study import readable, study_noise_multiplier

SHIPPED = REPO / "configs" / "studies" / "synthetic-quadratic.yaml"


# --- config --------------------------------------------------------------------------------


def test_shipped_config_loads_with_the_full_sweep() -> None:
    config = load_synthetic_config(SHIPPED)
    assert config.type == "synthetic-quadratic"
    assert config.dimensions[0] == 20 and config.dimensions[-1] == 2000
    assert set(config.algorithms) == {"dpzero", "dpgd-0th", "dp-gd"}
    assert len(config.patterns) == 3 and len(config.seeds) >= 2


def test_registries_match_the_names_the_config_allows() -> None:
    assert tuple(EFFECTIVE_RANK_PATTERNS) == PATTERN_NAMES
    assert tuple(ALGORITHMS) == ALGORITHM_NAMES


@pytest.mark.parametrize(
    ("data", "field", "value"),
    [
        ({"type": "grid-search"}, "type", "'grid-search'"),
        ({"dimensions": [20, 1]}, "dimensions", "1"),
        ({"dimensions": []}, "dimensions", "empty"),
        ({"dimensions": [20, 20]}, "dimensions", "repeats"),
        ({"patterns": ["rank-cubic"]}, "patterns", "'rank-cubic'"),
        ({"algorithms": ["dpzero", "mezo"]}, "algorithms", "'mezo'"),
        ({"privacy": {"epsilon": float("inf")}}, "privacy.epsilon", "inf"),
        ({"privacy": {"delta": 1.5}}, "privacy.delta", "1.5"),
        ({"privacy": {"accountant": "pure"}}, "privacy.accountant", "'pure'"),
        ({"steps": 0}, "steps", "0"),
        ({"grid": {"learning_rates": [0.1, -1.0]}}, "grid.learning_rates", "-1.0"),
        ({"grid": {"clip_thresholds": []}}, "grid.clip_thresholds", "empty"),
        ({"algorithm_grids": {"sgd": {}}}, "algorithm_grids", "'sgd'"),
        ({"seeds": []}, "seeds", "empty"),
        ({"stepz": 10}, "stepz", "unknown key"),
    ],
)
def test_bad_values_fail_naming_field_value_and_allowed(
    data: dict[str, object], field: str, value: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_synthetic_config(data, "study.yaml")
    message = str(caught.value)
    assert field in message and value in message
    assert "allowed" in message or "unknown key" in message or "Input should" in message


def test_grid_override_for_an_algorithm_that_is_not_run_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"algorithm_grids.*not run"):
        build_synthetic_config(
            {"algorithms": ["dpzero"], "algorithm_grids": {"dp-gd": {"learning_rates": [1.0]}}}
        )


def test_per_algorithm_grid_overrides_only_what_it_names() -> None:
    config = build_synthetic_config(
        {
            "grid": {"learning_rates": [0.1], "clip_thresholds": [1.0, 2.0]},
            "algorithm_grids": {"dp-gd": {"learning_rates": [0.5]}},
        }
    )
    assert config.grid_for("dp-gd").learning_rates == [0.5]
    assert config.grid_for("dp-gd").clip_thresholds == [1.0, 2.0]
    assert config.grid_for("dpzero").learning_rates == [0.1]


# --- problem and per-example stages ---------------------------------------------------------


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return make_problem("rank-log-d", 30, 64, seed=3)


def test_effective_ranks_follow_their_patterns() -> None:
    ranks = {
        pattern: [make_problem(pattern, d, 4, 0).effective_rank for d in (100, 1600)]
        for pattern in PATTERN_NAMES
    }
    assert ranks["rank-d"] == [100.0, 1600.0]
    # Σ_{j≤d} j^(-1/2) = 2√d + ζ(1/2) + O(d^(-1/2)), ζ(1/2) ≈ −1.4604
    assert ranks["rank-sqrt-d"] == pytest.approx([20 - 1.4604, 80 - 1.4604], rel=0.01)
    assert ranks["rank-log-d"][1] - ranks["rank-log-d"][0] == pytest.approx(np.log(16), rel=0.01)


def test_finite_differences_are_the_central_differences_of_the_example_losses(problem) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, problem.dimension))
    z = rng.normal(size=problem.dimension)
    smoothing = 1e-3
    expected = np.stack(
        [
            (
                problem.example_losses(row + smoothing * z)
                - problem.example_losses(row - smoothing * z)
            )
            / (2 * smoothing)
            for row in x
        ]
    )
    np.testing.assert_allclose(finite_differences(problem, x, z), expected, rtol=1e-7, atol=1e-9)


def test_gradient_and_loss_match_the_example_average(problem) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(1).normal(size=problem.dimension)
    np.testing.assert_allclose(problem.gradient(x), problem.example_gradients(x).mean(axis=0))
    assert problem.loss(x) == pytest.approx(problem.example_losses(x).mean())


CLIPS = np.array([0.05, 0.5, 2.5])


def test_dpzero_clips_every_scalar_to_plus_minus_c(problem) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, problem.dimension)) * 3
    differences = finite_differences(problem, x, rng.normal(size=problem.dimension))
    clipped = clip_scalars(differences, CLIPS)
    assert np.all(np.abs(clipped) <= CLIPS[:, None])
    assert np.any(np.abs(differences) > CLIPS[:, None])  # the bound was exercised
    inside = np.abs(differences) <= CLIPS[:, None]
    np.testing.assert_array_equal(clipped[inside], differences[inside])


def test_dpgd0th_clips_every_example_vector_in_l2(problem) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, problem.dimension)) * 3
    z = rng.normal(size=problem.dimension)
    differences = finite_differences(problem, x, z)
    vectors = dpgd0th_clipped_scalars(differences, z, CLIPS)[:, :, None] * z[None, None, :]
    norms = np.linalg.norm(vectors, axis=2)
    assert np.all(norms <= CLIPS[:, None] * (1 + 1e-12))
    # The same as clipping each materialized zeroth-order gradient s_i z in ℓ2.
    raw = differences[:, :, None] * z[None, None, :]
    raw_norms = np.linalg.norm(raw, axis=2)
    assert np.any(raw_norms > CLIPS[:, None])
    expected = raw * np.minimum(1.0, CLIPS[:, None] / raw_norms)[:, :, None]
    np.testing.assert_allclose(vectors, expected, rtol=1e-10, atol=1e-12)


def test_dpgd_clips_every_example_gradient_in_l2(problem) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, problem.dimension)) * 3
    scaled = problem.data * problem.hessian_diagonal
    factors = dpgd_clip_factors(problem, x, CLIPS, np.sum(scaled * scaled, axis=1))
    for k in range(len(CLIPS)):
        gradients = problem.example_gradients(x[k])
        norms = np.linalg.norm(gradients, axis=1)
        assert np.any(norms > CLIPS[k])
        clipped = gradients * factors[k][:, None]
        assert np.all(np.linalg.norm(clipped, axis=1) <= CLIPS[k] * (1 + 1e-9))
        np.testing.assert_allclose(factors[k], np.minimum(1.0, CLIPS[k] / norms), rtol=1e-9)


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_noiseless_step_is_the_mean_clipped_update(problem, name: str) -> None:  # type: ignore[no-untyped-def]
    """With σ = 0 one step is x − η/n Σ_i clip(contribution_i), computed here from the losses."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, problem.dimension))
    z = rng.normal(size=problem.dimension)
    rates, clips = np.array([0.1, 0.7]), np.array([0.2, 3.0])
    inputs = StepInputs(
        problem, z if ALGORITHMS[name].zeroth_order else None, rates, clips, 0.0, SecretNormal()
    )
    stepped = ALGORITHMS[name].step(x, inputs, {})
    for k in range(2):
        if name == "dp-gd":
            contributions = problem.example_gradients(x[k])
        else:
            delta = 1e-4
            diffs = (
                problem.example_losses(x[k] + delta * z) - problem.example_losses(x[k] - delta * z)
            ) / (2 * delta)
            if name == "dpzero":
                contributions = np.clip(diffs, -clips[k], clips[k])[:, None] * z[None, :]
            else:
                contributions = diffs[:, None] * z[None, :]
        if name != "dpzero":
            norms = np.linalg.norm(contributions, axis=1, keepdims=True)
            contributions = contributions * np.minimum(1.0, clips[k] / norms)
        expected = x[k] - rates[k] * contributions.sum(axis=0) / problem.dataset_size
        np.testing.assert_allclose(stepped[k], expected, rtol=1e-6, atol=1e-9)


def test_noiseless_aggregated_step_clips_each_examples_directions_together(problem) -> None:  # type: ignore[no-untyped-def]
    """DP-AggZO with σ = 0: x − η/(J n) Σ_j Σ_i clip_ℓ2(s_i)_j z_j, from the losses."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, problem.dimension))
    z = rng.normal(size=(3, problem.dimension))
    rates, clips = np.array([0.1, 0.7]), np.array([0.2, 3.0])
    inputs = StepInputs(problem, z, rates, clips, 0.0, SecretNormal())
    stepped = ALGORITHMS["dpzero"].step(x, inputs, {})
    delta = 1e-4
    for k in range(2):
        diffs = np.stack(
            [
                (
                    problem.example_losses(x[k] + delta * row)
                    - problem.example_losses(x[k] - delta * row)
                )
                / (2 * delta)
                for row in z
            ],
            axis=1,
        )  # (n, J)
        norms = np.linalg.norm(diffs, axis=1, keepdims=True)
        clipped = diffs * np.minimum(1.0, clips[k] / norms)
        assert np.linalg.norm(clipped, axis=1).max() <= clips[k] * (1 + 1e-12)
        update = clipped.sum(axis=0) @ z / (3 * problem.dataset_size)
        np.testing.assert_allclose(stepped[k], x[k] - rates[k] * update, rtol=1e-6, atol=1e-9)


def test_one_direction_per_step_keeps_the_dpzero_trajectory(problem) -> None:  # type: ignore[no-untyped-def]
    """directions_per_step=1 draws the same public directions as DPZero always did: with σ = 0
    the runs agree exactly; several directions per step only for dpzero."""
    rates, clips = np.array([0.05]), np.array([1.0])
    one = run_algorithm("dpzero", problem, rates, clips, steps=5, noise_multiplier=0.0, seed=2)
    again = run_algorithm(
        "dpzero",
        problem,
        rates,
        clips,
        steps=5,
        noise_multiplier=0.0,
        seed=2,
        directions_per_step=1,
    )
    assert one.final_loss.tolist() == again.final_loss.tolist()
    several = run_algorithm(
        "dpzero",
        problem,
        rates,
        clips,
        steps=5,
        noise_multiplier=0.0,
        seed=2,
        directions_per_step=4,
    )
    assert several.final_loss.tolist() != one.final_loss.tolist()
    with pytest.raises(ValueError, match="only dpzero takes more"):
        run_algorithm(
            "dp-gd",
            problem,
            rates,
            clips,
            steps=1,
            noise_multiplier=0.0,
            seed=2,
            directions_per_step=2,
        )


# --- noise and privacy ---------------------------------------------------------------------


def test_sigma_is_privzos_calibration_for_full_batch_steps() -> None:
    config = build_synthetic_config(
        {"steps": 250, "privacy": {"epsilon": 1.5, "delta": 1e-5, "accountant": "rdp"}}
    )
    expected = calibrate_noise_multiplier(
        epsilon=1.5,
        delta=1e-5,
        sample_rate=1.0,
        steps=250,
        mechanism="gaussian",
        accountant="rdp",
    )
    assert study_noise_multiplier(config) == expected
    assert expected > 1.0  # 250 full-batch releases at ε = 1.5 need real noise


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_noise_is_secret_and_scaled_by_sigma(problem, name: str) -> None:  # type: ignore[no-untyped-def]
    """Same seed and σ = 0: identical runs. σ > 0: the noise differs run to run (it is not
    derived from the seed), and its spread grows with σ."""
    rates, clips = np.array([0.05]), np.array([1.0])

    def final(sigma: float) -> float:
        result = run_algorithm(
            name, problem, rates, clips, steps=20, noise_multiplier=sigma, seed=7
        )
        return float(result.final_gradient_norm[0])

    assert final(0.0) == final(0.0)
    small = [final(0.5) for _ in range(6)]
    large = [final(50.0) for _ in range(6)]
    assert len(set(small)) == 6
    assert np.std(large) > np.std(small)


# --- the study ----------------------------------------------------------------------------


# The dimension test at a small size (d = 20 and 400, effective rank ≈ ln d). Over ~20 repeats with
# 3-10 seeds the growth ratio growth(DPGD-0th) / growth(DPZero) was 1.14-1.89 (mean ≈ 1.5, sd ≈
# 0.17); DPZero grew 1.1-1.7x, DPGD-0th 1.7-2.5x. DPGD-0th cannot grow much further: by d = 400 it
# is close to its starting gradient norm (≈ 1.28), where a tiny learning rate leaves it. So at this
# size the gap is real but not large, and the default-suite check only asks that DPZero grow less
# (threshold 1.1; with the 8 seeds used here, 8 repeats gave 1.33-1.73); the slow test below checks
# the "far less" claim over d = 20..2000, where the measured ratio was 1.75-2.17.
SMALL_STUDY_SEEDS = 8


@pytest.fixture(scope="module")
def small_study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    config = build_synthetic_config(
        {
            "dimensions": [20, 400],
            "patterns": ["rank-log-d"],
            "algorithms": ["dpzero", "dpgd-0th"],
            "steps": 1000,
            "dataset_size": 100,
            "grid": {
                "learning_rates": [0.01, 0.03, 0.1, 0.3, 1.0],
                "clip_thresholds": [0.1, 0.3, 1.0, 3.0],
            },
            "seeds": list(range(SMALL_STUDY_SEEDS)),
        }
    )
    return run_synthetic_study(config, tmp_path_factory.mktemp("study"), progress=False)


def test_small_study_writes_every_run_the_table_and_the_figure(
    small_study: dict[str, object],
) -> None:
    results = pd.read_parquet(small_study["results_path"])
    # patterns × dimensions × algorithms × seeds × grid points
    assert len(results) == 1 * 2 * 2 * SMALL_STUDY_SEEDS * 5 * 4
    assert (results["noise_multiplier"] == small_study["noise_multiplier"]).all()
    table = Path(small_study["table_path"]).read_text()
    assert "not private" in table and "rank-log-d" in table
    assert Path(small_study["figure_path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(small_study["rows"]) == 2 * 2


def test_dpzero_grows_less_with_dimension_than_dpgd0th(
    small_study: dict[str, object],
) -> None:
    """The dimension test: effective rank ≈ ln d + 0.58 (3.6 at d = 20, 6.6 at d = 400)."""
    best = {(row["algorithm"], row["dimension"]): row["mean"] for row in small_study["rows"]}
    growth = {name: best[(name, 400)] / best[(name, 20)] for name in ("dpzero", "dpgd-0th")}
    assert growth["dpgd-0th"] > 1.1 * growth["dpzero"], growth


@pytest.mark.slow
def test_over_the_full_dimension_range_dpzero_stays_nearly_flat(tmp_path: Path) -> None:
    """d from 20 to 2000 at effective rank ≈ ln d. Measured with 6 seeds over 6 repeats: DPZero
    grew 1.19-1.57x, DPGD-0th 2.1-2.95x, ratio 1.37-2.17; with 8 seeds a run of the marked
    suite drew 1.79 (the noise is fresh each run), so this uses 16. In the shipped study
    (3 seeds) DPZero went 0.196 → 0.251, DPGD-0th 0.374 → 1.12."""
    config = build_synthetic_config(
        {
            "dimensions": [20, 2000],
            "patterns": ["rank-log-d"],
            "algorithms": ["dpzero", "dpgd-0th"],
            "steps": 1000,
            "dataset_size": 100,
            "grid": {
                "learning_rates": [0.001, 0.01, 0.03, 0.1, 0.3, 1.0],
                "clip_thresholds": [0.1, 0.3, 1.0, 3.0, 30.0],
            },
            "seeds": list(range(16)),
        }
    )
    rows = run_synthetic_study(config, tmp_path, progress=False)["rows"]
    best = {(row["algorithm"], row["dimension"]): row["mean"] for row in rows}
    growth = {name: best[(name, 2000)] / best[(name, 20)] for name in ("dpzero", "dpgd-0th")}
    assert growth["dpzero"] < 1.75, growth
    assert growth["dpgd-0th"] > 1.25 * growth["dpzero"], growth


def test_synthetic_table_numbers_have_no_exponent() -> None:
    assert readable(1000.0, 3) == "1,000" and readable(25_600.4, 3) == "25,600"
    assert readable(12.345, 3) == "12.3" and readable(0.000123, 2) == "0.00012"
