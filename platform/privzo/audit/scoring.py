"""Every requested score of the audited run's canaries: black-box from the base and the
fine-tuned losses, white-box from a replay of its trajectory (``privzo.audit.scores`` computes
each score)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from privzo.audit.config import WHITE_BOX_SCORES, AuditConfig, ScoreName
from privzo.audit.record import RUN_DIR
from privzo.audit.scores import (
    WhiteBoxTrace,
    canary_losses,
    centre_by_label,
    correlation_scores,
    data_directions,
    directional_scores,
    gradient_ratio,
    likelihood_scores,
    match_scores,
    replay_differences,
    without_noise,
)
from privzo.audit.training import TunedLosses
from privzo.config.run import RunConfig
from privzo.models.loading import load_model
from privzo.rundir import TRAJECTORY_FILE, RunSummary

# A match is exact or not whatever the canary's label: standardising per label would only mix
# the two labels' exact matches with the other label's near misses.
UNCENTRED_SCORES = ("white-box-match",)
# (draws, noise scale σC) → the noise a broken run added, regenerated from its seed: one draw per
# released value (K a step with K directions), in the order drawn
PublicNoise = Callable[[int, float], np.ndarray]


def score_canaries(
    config: RunConfig,
    audit: AuditConfig,
    scores: list[ScoreName],
    summary: RunSummary,
    tuned: TunedLosses,
    output_dir: Path,
    cache_dir: Path,
    public_noise: PublicNoise | None = None,
) -> tuple[dict[ScoreName, np.ndarray], float | None]:
    """Every requested score of every canary (in canary order), and the canaries' gradient
    ratio ρ to the reference rows measured in the replay (None without one)."""
    base = load_model(config.model, cache_dir, progress=False)
    base_losses = canary_losses(tuned.task, base.model, tuned.encoded, audit.score_batch_size)
    values: dict[ScoreName, np.ndarray] = {"black-box": base_losses - tuned.losses}
    ratio = None
    if any(name in WHITE_BOX_SCORES for name in scores):
        clip = config.privacy.clip if summary.private else None
        trace = replay_differences(
            config.model.name_or_path,
            output_dir / RUN_DIR / TRAJECTORY_FILE,
            tuned.task,
            tuned.replayed,
            clip=clip,
            batch_size=audit.score_batch_size,
            cache_dir=cache_dir,
        )
        ratio = replay_gradient_ratio(trace, tuned)
        trace, data = split_references(trace, tuned)
        batch = config.optimizer.batch_size
        if public_noise is not None and summary.noise_multiplier is not None:
            scale = summary.noise_multiplier * config.privacy.clip
            draws = public_noise(summary.steps * trace.directions, scale)
            trace = without_noise(trace, draws, batch)
        values["white-box-directional"] = directional_scores(trace, tuned.injection.labels, data)
        values["white-box-correlation"] = correlation_scores(trace)
        values["white-box-likelihood"] = likelihood_scores(trace, batch, summary.sample_rate)
        values["white-box-match"] = match_scores(trace, batch, clip)
    labels = tuned.injection.labels
    return {
        name: values[name] if name in UNCENTRED_SCORES else centre_by_label(values[name], labels)
        for name in scores
    }, ratio


def replay_gradient_ratio(trace: WhiteBoxTrace, tuned: TunedLosses) -> float | None:
    """ρ of the replayed canaries against the replayed reference rows (``gradient_ratio``)."""
    count = len(tuned.injection.canaries)
    return gradient_ratio(
        trace.differences[:, :count],
        tuned.injection.labels,
        trace.differences[:, count:],
        np.asarray(tuned.replayed.labels)[count:],
    )


def split_references(trace: WhiteBoxTrace, tuned: TunedLosses) -> tuple[WhiteBoxTrace, np.ndarray]:
    """The canaries' trace and the data's shared directions from the reference rows' columns."""
    count = len(tuned.injection.canaries)
    references = trace.differences[:, count:]
    canaries = replace(trace, differences=trace.differences[:, :count])
    if references.shape[1] == 0:
        return canaries, np.zeros((references.shape[0], 0))
    labels = np.asarray(tuned.replayed.labels)[count:]
    return canaries, data_directions(references, labels)
