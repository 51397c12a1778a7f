"""The large-gradient canaries on a tiny model, the canaries' gradient ratio ρ, and the
separation the power module expects at ρ against the directional score's on a release shaped
like the shipped MeZO run's (shuffled batches, canaries among the data)."""

from __future__ import annotations

import numpy as np
import pytest

from privzo.audit.canaries import loud_words, make_large_gradient_canaries, tokenizer_words
from privzo.audit.power import expected_separation, separation_ceiling
from privzo.audit.probe import BaseModelProbe
from privzo.audit.scores import (
    WhiteBoxTrace,
    centre_by_label,
    directional_scores,
    gradient_ratio,
)
from privzo.models.loading import load_model
from privzo.tasks import resolve_task_config
from privzo.tasks.build import build_task
from privzo.tasks.classification import PromptClassificationTask


@pytest.fixture
def probed(tiny_run_config, cache_dir):
    config = tiny_run_config()
    loaded = load_model(config.model, cache_dir, progress=False)
    task_config = resolve_task_config(config.task, loaded.kind)
    task = build_task(task_config, loaded.tokenizer, loaded.kind, None)
    assert isinstance(task, PromptClassificationTask)
    words = tokenizer_words(loaded.tokenizer, task_config.label_words or [])
    return BaseModelProbe(loaded.model, task), task_config, words


def test_large_gradient_canaries_use_the_loudest_words_against_the_models_label(probed):
    probe, task_config, words = probed
    loud = loud_words(words, task_config, 4, np.random.default_rng(0), probe, probed_words=64)
    quiet = [word for word in words if word not in loud][:16]
    prompts = [{"sentence": " ".join([word] * 4), "label": 0} for word in loud + quiet]
    for row, label in zip(prompts, probe.disfavoured_labels(prompts), strict=True):
        row["label"] = int(label)
    sizes = probe.gradient_sizes(prompts)
    # the loud quarter of the sample, not other words
    assert np.median(sizes[: len(loud)]) > np.median(sizes[len(loud) :])
    canaries = make_large_gradient_canaries(
        words, task_config, 24, 4, np.random.default_rng(1), probe, probed_words=32
    )
    assert len(canaries) == 24
    assert [row["label"] for row in canaries] == probe.disfavoured_labels(canaries).tolist()


def test_the_gradient_ratio_compares_the_unshared_parts():
    rng = np.random.default_rng(0)
    shared = rng.normal(scale=10.0, size=(500, 1))  # a label's shared part: not counted
    canaries = shared + 3.0 * rng.normal(size=(500, 40))
    rows = shared + rng.normal(size=(500, 40))
    ratio = gradient_ratio(canaries, np.zeros(40), rows, np.zeros(40))
    assert ratio == pytest.approx(9.0, rel=0.1)
    assert gradient_ratio(canaries, np.zeros(40), rows[:, :0], np.zeros(0)) is None


def shuffled_release(ratio: float, seed: int, steps=1500, batch=16, rows=400, canaries=400):
    """A release like the shipped run's: shuffled fixed-size batches over the data rows and the
    in-canaries; every d independent N(0, 1), the canaries' scaled by √ρ."""
    rng = np.random.default_rng(seed)
    included = rng.permutation(np.arange(canaries) % 2 == 0)
    members = np.concatenate([np.full(rows, -1), np.flatnonzero(included)])
    differences = rng.normal(size=(steps, canaries)) * np.sqrt(ratio)
    totals, order = np.zeros(steps), np.zeros(0, dtype=np.int64)
    for step in range(steps):
        if order.size < batch:
            order = np.concatenate([order, rng.permutation(members.size)])
        picked, order = members[order[:batch]], order[batch:]
        in_batch = picked[picked >= 0]
        totals[step] = (
            differences[step, in_batch].sum() + rng.normal(size=batch - in_batch.size).sum()
        )
    labels = np.arange(canaries) % 2
    scores = centre_by_label(
        directional_scores(WhiteBoxTrace(differences, totals / batch), labels), labels
    )
    return float(scores[included].mean() - scores[~included].mean()), int(included.sum())


@pytest.mark.parametrize("ratio", [1.0, 100.0])
def test_the_expected_separation_is_the_directional_scores_and_stays_under_the_ceiling(ratio):
    separations = [shuffled_release(ratio, seed) for seed in range(2)]
    measured = np.mean([value for value, _ in separations])
    canaries_in = separations[0][1]
    expected = expected_separation(1500, 16, 400, canaries_in, ratio)
    ceiling = separation_ceiling(1500, 16, 400, canaries_in)
    assert expected <= ceiling
    # two releases of 200 in- and 200 out-canaries: a standard error of about 0.07
    assert abs(measured - expected) < 0.25
    # canaries 100 times the data's size come within 5 % of the ceiling, and no further
    if ratio > 1:
        assert expected > 0.95 * ceiling and measured < ceiling + 0.25
