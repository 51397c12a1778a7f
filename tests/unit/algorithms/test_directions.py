"""``optimizer.directions_per_step``: its bounds, the refusals before anything loads, and the
privacy it costs (the same ε as one direction at the same σ)."""

from __future__ import annotations

import pytest

from privzo.algorithms.config import MAX_DIRECTIONS
from privzo.config import ConfigError, load_config
from privzo.preflight import preflight
from privzo.privacy import compute_epsilon

CONTINUOUS = "privacy.noise_grid=null"
CONTINUOUS_RDP = ("optimizer.directions_per_step=4", CONTINUOUS, "privacy.accountant=rdp")


@pytest.mark.parametrize("count", [0, -3, MAX_DIRECTIONS + 1])
def test_out_of_range_counts_are_refused_at_load(count):
    with pytest.raises(ConfigError, match="directions_per_step"):
        load_config(None, [f"optimizer.directions_per_step={count}"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.algorithm=dpzo-laplace", CONTINUOUS], "privacy.mechanism='laplace'"),
        (
            ["privacy.mechanism=lmo", "privacy.accountant=numeric", CONTINUOUS],
            "privacy.mechanism='lmo'",
        ),
        ([], "privacy.noise_grid="),  # the default grid
        (["optimizer.algorithm=dpsgd"], "only \\['mezo', 'dpzero', 'dpzo-laplace'\\]"),
        (["optimizer.algorithm=dpgd-0th"], "only \\['mezo', 'dpzero', 'dpzo-laplace'\\]"),
    ],
)
def test_several_directions_are_refused_where_the_bound_does_not_hold(
    tiny_run_config, overrides, message
):
    config = tiny_run_config("optimizer.directions_per_step=4", *overrides)
    with pytest.raises(ConfigError, match=f"directions_per_step=4 with .*{message}"):
        preflight(config)


def test_gaussian_and_mezo_take_several_directions_and_check_prints_the_cost(tiny_run_config):
    private = preflight(tiny_run_config("optimizer.directions_per_step=4", CONTINUOUS))
    assert private.forwards_per_step == 8 and private.to_json()["directions_per_step"] == 4
    assert "cost        8 forwards per step (4 direction(s) × 2" in "\n".join(private.describe())
    mezo = preflight(tiny_run_config("optimizer.algorithm=mezo", "optimizer.directions_per_step=3"))
    assert mezo.forwards_per_step == 6


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_is_the_same_for_one_and_eight_directions(tiny_run_config, accountant):
    """K Gaussian sums of L2 sensitivity C cost what one sum of sensitivity C does: the
    accountants give the same ε at a fixed σ, and calibration the same σ at a target ε."""
    plans = {}
    for count in (1, 8):
        common = (CONTINUOUS, f"privacy.accountant={accountant}")
        fixed = tiny_run_config(
            f"optimizer.directions_per_step={count}", "privacy.noise_multiplier=1.3", *common
        )
        calibrated = tiny_run_config(f"optimizer.directions_per_step={count}", *common)
        plans[count] = (preflight(fixed).privacy, preflight(calibrated).privacy)
    (fixed_one, calibrated_one), (fixed_eight, calibrated_eight) = plans[1], plans[8]
    assert fixed_one.epsilon == fixed_eight.epsilon and 0 < fixed_one.epsilon < float("inf")
    assert calibrated_one.noise_multiplier == calibrated_eight.noise_multiplier
    assert calibrated_one.epsilon == calibrated_eight.epsilon


def test_the_grid_takes_several_directions_with_the_accountant_that_bounds_them(tiny_run_config):
    """On the default grid, K = 4 runs under rdp (the rounded vector's RDP bound) and its ε is
    that bound's; pld, which bounds one rounded scalar, is refused naming rdp."""
    config = tiny_run_config(
        "optimizer.directions_per_step=4", "privacy.accountant=rdp", "privacy.noise_multiplier=1.3"
    )
    plan = preflight(config).privacy
    grid = config.privacy.noise_grid
    assert plan.noise_parameters == {"grid": grid, "directions": 4}
    expected = compute_epsilon(
        noise_multiplier=1.3,
        sample_rate=plan.sample_rate,
        steps=config.optimizer.steps,
        delta=plan.mechanism_delta,
        accountant="rdp",
        noise_parameters={"grid": grid, "directions": 4},
    )
    assert plan.epsilon == expected
    continuous = preflight(tiny_run_config(*CONTINUOUS_RDP, "privacy.noise_multiplier=1.3"))
    assert continuous.privacy.epsilon < plan.epsilon < 1.05 * continuous.privacy.epsilon
    with pytest.raises(ConfigError, match=r"privacy.accountant='pld'.*allowed: .*\['rdp'\]"):
        preflight(tiny_run_config("optimizer.directions_per_step=4"))
