"""Membership scores of the canaries: higher means "more likely trained on".

- black-box: the canary's loss under the base model minus under the fine-tuned one (how much
  training lowered it), from the released model alone.
- white-box (zeroth-order runs): the trajectory and the public seeds give θ_t and z_t at every
  step, so the auditor recomputes each canary's projected gradient d_c(θ_t) = (l_c(θ_t + εz_t)
  − l_c(θ_t − εz_t)) / 2ε, clipped to [−C, C] as training would, and compares it with the
  released g_t:
  * correlation: Σ_t g_t · d_c(θ_t);
  * match: how closely some released G_t = g_t · B equals d_c(θ_t) (the best match over the
    steps, on a log scale). A step whose batch held c alone releases exactly d_c(θ_t) when
    nothing is added: a run without noise (MeZO with batches of one, or a private run whose
    noise is broken) gives itself away at the first such step, while noise of scale σC hides
    every match. Steps that clipped the canary's difference to ±C are skipped (one direction):
    every canary clipped there matches a lone clipped example alike;
  * likelihood: Σ_t log[(1 − p) + p · N(G_t; μ + d_c, V) / N(G_t; μ, V)], the Gaussian likelihood
    ratio of "c was in the step's batch with probability p" against "c was not", with
    G_t = g_t · B the released sum, and μ, V the mean and variance of the G_t (the other
    examples and the noise, taken as Gaussian). It gains only on steps whose G_t matches d_c,
    where the correlation also sums the steps that did not sample c.
  * directional (the default): the correlation made fair across canaries. g_t first loses its
    least-squares fit on the shared directions, which move g_t alike for every canary: the
    labels' (each step's mean d over a label's canaries, the canary itself left out) and the
    data's (each step's mean d over a fixed sample of the private rows, per label, where given);
    the residual r_t keeps what the batch's own directions put in it. The sum Σ_t r_t · d_c(θ_t) is
    then divided by √Σ_t (r_t · d_c(θ_t))², so an out-canary's score is about N(0, 1) whatever
    the size of its gradient, while an in-canary's own derivative enters g_t at every step that
    sampled it (d_c² / B each time) and lifts its score.

With K directions per step (``optimizer.directions_per_step``, DP-AggZO) step t releases the
K-vector g_t = (g_{t,1}..g_{t,K}) along z_{t,1}..z_{t,K}, and training clipped each example's
K-vector of differences to L2 norm C. The replay measures the canary's K differences the same
way and clips its K-vector as training would, and each score reads the step's K-vectors where
it read the scalars: the correlation and the directional score take the inner product
⟨r_t, d_c(θ_t)⟩ per step (the label and data fits are made on the T·K released coordinates,
whose directions are drawn alike), the match the L2 distance |G_t − d_c(θ_t)|, and the
likelihood the K-dimensional Gaussian ratio with the coordinates' pooled mean and variance.
With K = 1 each is the one-direction score, computed as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from privzo.models.peft_views import unwrap_for_scoring
from privzo.replay import prepare_replay
from privzo.tasks.interface import ScoringTask
from privzo.zo.trajectory import replay_steps

MATCH_FLOOR = 1e-12  # relative gap below float64 resolution: an exact match


def centre_by_label(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Scores standardised within each canary label (median 0, unit spread).

    Every canary of a label shares the label word's direction in weight space, so training on
    any of them moves all of them: raw scores form one cluster per label, and guessing from the
    raw ranking mostly guesses labels. The labels are the auditor's own (public to it, not the
    coins), so comparing a canary only with canaries of its label stays a valid guess.
    """
    centred = np.zeros_like(scores, dtype=np.float64)
    for label in np.unique(labels):
        members = labels == label
        group = scores[members]
        spread = float(np.std(group)) or 1.0
        centred[members] = (group - np.median(group)) / spread
    return centred


def canary_losses(
    task: ScoringTask, model: torch.nn.Module, encoded, batch_size: int
) -> np.ndarray:
    """Per-canary fp32 losses under ``model``, in canary order."""
    losses = []
    with torch.inference_mode():
        for start in range(0, len(encoded), batch_size):
            indices = range(start, min(start + batch_size, len(encoded)))
            batch = task.collate(encoded, indices)
            losses.append(task.per_example_loss(model, batch).float().cpu().numpy())
    return np.concatenate(losses).astype(np.float64)


@dataclass(frozen=True)
class WhiteBoxTrace:
    """What the replay measured: d_c(θ_t) per released coordinate and canary, and the released
    g. A row is one direction of one step; a step's K rows are consecutive (direction order)."""

    differences: np.ndarray  # [steps · K, canaries], clipped as in training
    projected_gradients: np.ndarray  # [steps · K]
    directions: int = 1  # K, per step

    def __post_init__(self) -> None:
        rows = self.projected_gradients.shape[0]
        if self.directions < 1 or rows % self.directions or self.differences.shape[0] != rows:
            raise ValueError(
                f"{self.differences.shape[0]} rows of differences and {rows} released values "
                f"do not make whole steps of {self.directions} directions"
            )

    @property
    def steps(self) -> int:
        return self.projected_gradients.shape[0] // self.directions

    def per_step(self, values: np.ndarray) -> np.ndarray:
        """[steps, canaries]: each step's sum over its K rows of ``values`` ([steps · K, …])."""
        if self.directions == 1:
            return values
        return values.reshape(self.steps, self.directions, -1).sum(axis=1)


def replay_differences(
    base: str,
    trajectory: Path,
    task: ScoringTask,
    encoded,
    *,
    clip: float | None,
    batch_size: int,
    cache_dir: Path,
) -> WhiteBoxTrace:
    """Replay the trajectory from the base model, measuring every canary's loss at θ_t ± εz_t."""
    setup = prepare_replay(base, trajectory, cache_dir=cache_dir, progress=False)
    scoring = unwrap_for_scoring(setup.model)
    plus: list[np.ndarray] = []
    minus: list[np.ndarray] = []

    def probe(row: dict, direction: int, sign: int) -> None:  # in step, then direction order
        (plus if sign > 0 else minus).append(canary_losses(task, scoring, encoded, batch_size))

    replay_steps(setup.perturber, setup.table, setup.meta, at_perturbed=probe)
    differences = (np.stack(plus) - np.stack(minus)) / (2.0 * setup.meta.perturbation_scale)
    # as training's estimator does (GradientEstimator.sanitize): a non-finite difference counts 0
    differences = np.nan_to_num(differences, nan=0.0, posinf=0.0, neginf=0.0)
    directions = setup.meta.directions
    if clip is not None:
        differences = clip_as_trained(differences, clip, directions)
    released = zip(
        setup.table.column("projected_gradient").to_pylist(),
        setup.table.column("extra_projected_gradients").to_pylist(),
        strict=True,
    )
    gradients = np.asarray([[first, *extra] for first, extra in released], dtype=np.float64)
    return WhiteBoxTrace(differences, gradients.reshape(-1), directions)


def clip_as_trained(differences: np.ndarray, clip: float, directions: int) -> np.ndarray:
    """Each canary's difference to [−C, C], or its K differences of a step to L2 norm C, as
    ``PrivateEstimator.clip_each`` clips each example's (rows as in ``WhiteBoxTrace``)."""
    if directions == 1:
        return np.clip(differences, -clip, clip)
    steps = differences.reshape(-1, directions, differences.shape[1])
    norms = np.linalg.norm(steps, axis=1, keepdims=True)
    with np.errstate(divide="ignore"):  # a zero vector: C / 0 = inf → factor 1, stays 0
        factors = np.minimum(clip / norms, 1.0)
    return (steps * factors).reshape(differences.shape)


def without_noise(trace: WhiteBoxTrace, noise: np.ndarray, batch_size: float) -> WhiteBoxTrace:
    """The trace with each known noise draw taken out of its g (g = (Σ clipped d + noise) / B);
    ``noise`` holds one draw per released value, in the order drawn."""
    if noise.shape != trace.projected_gradients.shape:
        raise ValueError(
            f"{noise.shape[0]} noise draws for {trace.projected_gradients.size} released values"
        )
    gradients = trace.projected_gradients - noise / batch_size
    return replace(trace, projected_gradients=gradients)


def correlation_scores(trace: WhiteBoxTrace) -> np.ndarray:
    """Σ_t ⟨g_t, d_c(θ_t)⟩ per canary (with one direction, Σ_t g_t · d_c(θ_t))."""
    return trace.projected_gradients @ trace.differences


def unshared_gradients(
    trace: WhiteBoxTrace, labels: np.ndarray, data: np.ndarray | None = None
) -> np.ndarray:
    """[rows, canaries]: g less its least-squares fit on the labels' shared directions.

    A label's shared direction at step t is the mean d over its canaries: the label word's part
    of the gradient, which moves g_t alike for every canary of the label and so is only noise to
    the score. The canary itself is left out of its own label's mean, else the fit would take its
    own derivative out of g_t at every step, in-canaries' included. ``data`` ([rows, D]) adds
    the data's shared directions, the same for every canary. With K directions each released
    coordinate is a row of the fit: every direction's g is formed alike from the batch.
    """
    values = np.unique(labels)
    sums = np.stack([trace.differences[:, labels == label].sum(axis=1) for label in values], 1)
    counts = np.array([(labels == label).sum() for label in values], dtype=np.float64)
    means = sums / counts
    gradients = trace.projected_gradients
    residuals = np.empty(trace.differences.shape, dtype=np.float64)
    for index, label in enumerate(labels):
        own = int(np.searchsorted(values, label))
        shared = means.copy()
        shared[:, own] = (sums[:, own] - trace.differences[:, index]) / max(counts[own] - 1, 1)
        if data is not None:
            shared = np.concatenate([shared, data], axis=1)
        fit, *_ = np.linalg.lstsq(shared, gradients, rcond=None)
        residuals[:, index] = gradients - shared @ fit
    return residuals


def data_directions(differences: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[rows, labels]: each released coordinate's mean d over the reference rows of each label."""
    return np.stack(
        [differences[:, labels == label].mean(axis=1) for label in np.unique(labels)], 1
    )


def unshared(differences: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[steps, rows]: each row's d less its label's mean d at the same step."""
    result = np.empty_like(differences, dtype=np.float64)
    for label in np.unique(labels):
        members = labels == label
        result[:, members] = differences[:, members] - differences[:, members].mean(
            1, keepdims=True
        )
    return result


def gradient_ratio(
    canaries: np.ndarray,
    canary_labels: np.ndarray,
    references: np.ndarray,
    reference_labels: np.ndarray,
) -> float | None:
    """ρ: the canaries' mean squared d over the reference rows', each less its label's shared
    part (what the directional score sees); None when the rows' part is zero or unmeasured."""
    if references.shape[1] == 0 or canaries.shape[1] == 0:
        return None
    rows = float(np.mean(unshared(references, reference_labels) ** 2))
    if rows <= 0:
        return None
    return float(np.mean(unshared(canaries, canary_labels) ** 2)) / rows


def directional_scores(
    trace: WhiteBoxTrace, labels: np.ndarray, data: np.ndarray | None = None
) -> np.ndarray:
    """Σ_t ⟨r_t, d_c(θ_t)⟩ / √Σ_t ⟨r_t, d_c(θ_t)⟩² per canary (see the module docstring)."""
    products = trace.per_step(unshared_gradients(trace, labels, data) * trace.differences)
    spread = np.sqrt((products**2).sum(axis=0))
    return products.sum(axis=0) / np.where(spread > 0, spread, 1.0)


def match_scores(trace: WhiteBoxTrace, batch_size: float, clip: float | None = None) -> np.ndarray:
    """−log of the closest |G_t − d_c(θ_t)| (L2 over a step's K coordinates) over the steps,
    relative to the spread of G's coordinates.

    With one direction and a ``clip`` C, the steps where the canary's difference was clipped to
    ±C are left out: a lone clipped example releases exactly ±C, which every canary clipped at
    that step matches, in or out (a canary clipped at every step keeps its closest match).
    """
    totals = trace.projected_gradients * batch_size
    scale = float(np.std(totals)) or 1.0
    if trace.directions == 1:
        gaps = np.abs(totals[:, None] - trace.differences)
        if clip is not None:
            unclipped = np.where(np.abs(trace.differences) >= clip, np.inf, gaps).min(axis=0)
            gaps = np.where(np.isfinite(unclipped), unclipped, gaps.min(axis=0)) / scale
        else:
            gaps = gaps.min(axis=0) / scale
    else:
        distances = np.sqrt(trace.per_step((totals[:, None] - trace.differences) ** 2))
        gaps = distances.min(axis=0) / scale
    return -np.log(gaps + MATCH_FLOOR)


def likelihood_scores(trace: WhiteBoxTrace, batch_size: float, sample_rate: float) -> np.ndarray:
    """Σ_t log-likelihood ratio of c in vs out of step t's batch (see the module docstring);
    with K directions the coordinates' log-ratios add up within a step (given the batch, the
    K coordinates' noises and directions are independent)."""
    totals = trace.projected_gradients * batch_size  # G_t: the released (noised) sum
    center, variance = float(np.mean(totals)), float(np.var(totals))
    if variance <= 0:  # every G_t equal: nothing to compare against
        return np.zeros(trace.differences.shape[1])
    d = trace.differences
    shift = trace.per_step(((totals - center)[:, None] * d - d**2 / 2) / variance)
    rate = min(max(sample_rate, 1e-12), 1 - 1e-12)
    return np.logaddexp(np.log1p(-rate), np.log(rate) + shift).sum(axis=0)
