"""The directional score with the data's shared directions: replayed reference rows give each
step's data direction, which moves every g_t alike and, left in, drowns the canaries' own."""

from __future__ import annotations

import numpy as np

from privzo.audit.scores import (
    WhiteBoxTrace,
    centre_by_label,
    data_directions,
    directional_scores,
)


def release_with_data_direction(seed: int):
    """g_t: the data's shared direction (apart from the canaries' label directions) at 10 times
    a canary's scale, the sampled in-canaries' d_c and noise; 64 reference rows of two labels
    replayed as d = their label's data direction plus their own."""
    rng = np.random.default_rng(seed)
    steps, canaries, batch = 4000, 200, 8
    labels = np.arange(canaries) % 2
    included = rng.permutation(np.arange(canaries) % 2 == 0)
    label_shared = rng.normal(size=(steps, 2))
    differences = label_shared[:, labels] + rng.normal(size=(steps, canaries))
    data_shared = rng.normal(size=(steps, 2))
    reference_labels = np.arange(64) % 2
    references = data_shared[:, reference_labels] + rng.normal(size=(steps, 64))
    sampled = (rng.random((steps, canaries)) < 0.1) & included
    total = (differences * sampled).sum(axis=1) + 10 * (data_shared @ [1.0, -0.6])
    return WhiteBoxTrace(differences, total / batch), labels, included, references, reference_labels


def separation(scores: np.ndarray, included: np.ndarray) -> float:
    return float(scores[included].mean() - scores[~included].mean())


def test_the_data_directions_are_each_labels_mean_over_the_reference_rows():
    references = np.array([[1.0, 3.0, 10.0], [2.0, 4.0, 20.0]])
    directions = data_directions(references, np.array([0, 0, 1]))
    assert np.allclose(directions, [[2.0, 10.0], [3.0, 20.0]])


def test_removing_the_data_directions_lets_the_directional_score_see_the_canaries():
    trace, labels, included, references, reference_labels = release_with_data_direction(0)
    data = data_directions(references, reference_labels)
    without = centre_by_label(directional_scores(trace, labels), labels)
    with_data = centre_by_label(directional_scores(trace, labels, data), labels)
    # in- against out-canaries' mean score, in standard deviations: 0.69 and 1.20 when written
    assert separation(with_data, included) > 0.9
    assert separation(with_data, included) > 1.5 * separation(without, included)


def k_direction_release(seed: int, directions: int, in_release: bool = True):
    """2000 steps of K directions: each released coordinate is the sampled in-canaries' d_c
    along its own direction, the data's shared direction and noise; a step samples its batch
    once for all K coordinates."""
    rng = np.random.default_rng(seed)
    steps, canaries, batch = 2000, 100, 8
    labels = np.arange(canaries) % 2
    included = rng.permutation(np.arange(canaries) % 4 < 2)
    rows = steps * directions
    shared = rng.normal(scale=2.0, size=(rows, 2))
    differences = shared[:, labels] + rng.normal(size=(rows, canaries))
    in_batch = (rng.random((steps, canaries)) < 0.05) & included & in_release
    sampled = np.repeat(in_batch, directions, axis=0)
    total = (differences * sampled).sum(axis=1) + 5 * shared[:, 0] + rng.normal(size=rows)
    return WhiteBoxTrace(differences, total / batch, directions), labels, included


def test_k_directions_a_step_separate_the_canaries_further_at_the_same_steps():
    """Each of a step's K coordinates carries the sampled canaries' own derivatives along a new
    direction: in- against out-canaries' separation grows about √K (the audit's power)."""
    separations = {}
    for directions in (1, 4):
        runs = [k_direction_release(seed, directions) for seed in range(3)]
        separations[directions] = np.mean(
            [
                separation(centre_by_label(directional_scores(trace, labels), labels), included)
                for trace, labels, included in runs
            ]
        )
    # 0.42 and 1.16 standard deviations when written (√4 = 2 expected)
    assert separations[4] > 1.5 * separations[1] and separations[4] > 0.9


def test_directional_score_of_a_k_direction_release_without_canaries_is_standard_normal():
    trace, labels, _ = k_direction_release(5, 4, in_release=False)
    scores = centre_by_label(directional_scores(trace, labels), labels)
    assert abs(scores.mean()) < 0.35 and 0.7 < scores.std() < 1.3
