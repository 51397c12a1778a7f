"""Golden numbers: a seeded CPU MeZO run on the tiny model and calibrated σ values, checked
exactly on the platform they were recorded on.

A change that moves any of them (the direction generator, the step's arithmetic, the sampler's
order, the accountant) fails here by name, even where every behavioural test still passes. On
another torch build or CPU instruction set the forward's last bits differ, so there the run's
figures are compared to a tolerance that still catches a changed algorithm.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from privzo.config import load_config
from privzo.privacy import calibrate_noise_multiplier
from privzo.run import run

# torch version and CPU capability each set of figures was recorded with
RECORDED_ON = ("2.13.0+cpu", "AVX512")
MEZO_RECORDED_ON = ("2.13.0+cpu", "AVX2")

# tiny-opt, 64 sentiment rows (seed 1), MeZO, seeded shuffle, 6 steps of 8, lr 1e-3, μ 1e-3
MEZO_PROJECTED_GRADIENTS = [
    1.6842596530914307,
    -1.7750224564224482,
    0.18130983412265778,
    1.5343613028526306,
    0.0006034374237060547,
    4.026353120803833,
]
MEZO_ACCURACY = (0.95, 0.95)  # before, after (20 test rows, seed 2)

# (ε, q, T, accountant) at δ = 1e-5 → σ, to calibration's bisection
CALIBRATED_SIGMAS = {
    (2.0, 64 / 2000, 800, "pld"): 1.9881641595153816,  # the demo's tiny-dpzero.yaml
    (1.0, 0.01, 1000, "pld"): 1.4157041655770493,
    (8.0, 0.016, 10000, "rdp"): 1.2346590087908569,
}


def on_recorded_platform(recorded: tuple[str, str] = RECORDED_ON) -> bool:
    return (torch.__version__, torch.backends.cpu.get_cpu_capability()) == recorded


@pytest.mark.parametrize(("setting", "sigma"), CALIBRATED_SIGMAS.items())
def test_calibrated_sigmas(setting, sigma):
    epsilon, sample_rate, steps, accountant = setting
    calibrated = calibrate_noise_multiplier(
        epsilon=epsilon, delta=1e-5, sample_rate=sample_rate, steps=steps, accountant=accountant
    )
    if on_recorded_platform():
        assert calibrated == sigma
    else:  # FFTs and float libraries may round differently elsewhere
        assert calibrated == pytest.approx(sigma, rel=1e-9)


def test_seeded_mezo_run_on_the_tiny_model(tmp_path, sentiment_files):
    train, test = sentiment_files
    config = load_config(
        None,
        [
            "model.name_or_path=tiny-opt",
            f"task.train_path={train}",
            f"task.test_path={test}",
            "optimizer.algorithm=mezo",
            "optimizer.steps=6",
            "optimizer.batch_size=8",
            "optimizer.learning_rate=1e-3",
            "privacy.sampler=shuffle",
            "tracking.log_every=3",
            "tracking.backend=none",
        ],
    )
    # a cache of its own: the tiny model is built from its seed here, as on a user's machine
    summary = run(config, tmp_path / "run", cache_dir=tmp_path / "cache", progress=False)
    gradients = pq.read_table(tmp_path / "run" / "trajectory.parquet").column("projected_gradient")
    if on_recorded_platform(MEZO_RECORDED_ON):
        assert gradients.to_pylist() == MEZO_PROJECTED_GRADIENTS
        assert (summary["accuracy_before"], summary["accuracy_after"]) == MEZO_ACCURACY
    else:  # the first steps' loss differences agree to fp32 rounding, amplified by 1/(2μ)
        first = gradients.to_pylist()[:3]
        assert first == pytest.approx(MEZO_PROJECTED_GRADIENTS[:3], rel=1e-3)
