"""The audit's options: how many canaries, the confidence, the guesses and the scores."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from privzo.section import Section

ScoreName = Literal[
    "black-box",
    "white-box-directional",
    "white-box-correlation",
    "white-box-likelihood",
    "white-box-match",
]
WHITE_BOX_SCORES: tuple[ScoreName, ...] = (
    "white-box-directional",
    "white-box-correlation",
    "white-box-likelihood",
    "white-box-match",
)
ALL_SCORES: tuple[ScoreName, ...] = ("black-box", *WHITE_BOX_SCORES)
# How the canaries are made (``privzo.audit.canaries``), fixed before the run.
CanaryDesign = Literal["random-words", "large-gradient"]
# The score used when none is named, fixed before any run: the white-box one where the run writes
# a trajectory (one scalar per step, or K with K directions), else the only one the release allows.
DEFAULT_WHITE_BOX_SCORE: ScoreName = "white-box-directional"
DEFAULT_SCORE: ScoreName = "black-box"
# Default sweep of k (guesses per side) as fractions of the canaries: few confident guesses
# bound ε best when the scores separate only at the tails, many when they separate throughout.
K_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)


class AuditConfig(Section):
    """``privzo audit``'s settings (the audited run has its own ``RunConfig``)."""

    canaries: int = Field(1000, ge=2, description="M: canaries, each in by a secret fair coin.")
    alpha: float = Field(0.05, gt=0, lt=1, description="ε_lb holds at confidence 1 − alpha.")
    ks: list[int] | None = Field(
        None,
        description="Guesses per side to try (k highest 'in', k lowest 'out'), each ≤ M/2; "
        "null = a sweep over M × (1, 2, 5, 10, 25, 50) %. The sweep's tests are Bonferroni-"
        "corrected.",
    )
    scores: list[ScoreName] | None = Field(
        None,
        description="Scores to guess from, fixed before the run; null = the default score: "
        "white-box-directional where the algorithm writes a trajectory (of any "
        "optimizer.directions_per_step), else black-box. Every (score, k) pair is one test of "
        "the correction.",
    )
    fpr: float = Field(
        0.01,
        gt=0,
        lt=1,
        description="The false-positive rate at which the TPR estimate (with Clopper–Pearson "
        "intervals) is read.",
    )
    canary_design: CanaryDesign = Field(
        "random-words",
        description="random-words: random vocabulary words, random labels; large-gradient: "
        "the words whose prompts have the largest loss gradient on the base model, labelled "
        "against the base model's preference (larger directional derivatives for the "
        "white-box scores).",
    )
    canary_words: int = Field(
        12, ge=1, le=256, description="Words in each canary's random text field(s)."
    )
    score_batch_size: int = Field(250, ge=1, description="Canaries per forward when scoring.")

    @field_validator("ks")
    @classmethod
    def _positive_ks(cls, ks: list[int] | None) -> list[int] | None:
        if ks is not None and (not ks or min(ks) < 1):
            raise ValueError(f"ks={ks}: give one or more k ≥ 1 (or null for the sweep)")
        return ks

    def k_values(self) -> list[int]:
        """The k to try: the configured ones, or the sweep (≥ 1, distinct, ≤ M/2)."""
        if self.ks is not None:
            return sorted(set(self.ks))
        half = self.canaries // 2
        return sorted({min(half, max(1, round(f * self.canaries))) for f in K_FRACTIONS})
