"""ε_lb against the noise multiplier: one table row per audit, and the figure, read from the
audits' own ``audit.json`` records (nothing retyped by hand).

    python tools/audit_curve.py runs/audit-s*/audit.json --score white-box-match \\
        --plot docs/guides/audit-curve.png

Each record gives σ (``noise_multiplier``; none for a non-private run, drawn at the left), ε
claimed, each estimator's ε, the TPR at 1 % FPR, and the score's in- and out-canaries' means
and standard deviations, whose difference over their pooled spread is the separation.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CurvePoint:
    """One audit's reading of one score."""

    sigma: float | None  # None: a run without noise
    claimed: float | None
    one_run: float
    fdp: float
    tpr: float
    separation: float
    correct: int
    guesses: int
    source: Path


def estimator(record: dict[str, Any], name: str) -> float:
    """The named estimator's ε in the record (0 where it is absent)."""
    return next((e["epsilon"] for e in record["estimators"] if e["estimator"] == name), 0.0)


def curve_point(path: Path, score: str) -> CurvePoint:
    """Read one ``audit.json``; the separation is (mean in − mean out) / √((sd_in² + sd_out²)/2)."""
    record = json.loads(path.read_text())
    scores = record["score_distributions"][score]
    pooled = math.sqrt((scores["in"]["std"] ** 2 + scores["out"]["std"] ** 2) / 2) or 1.0
    best = max(record["results"][score], key=lambda r: r["epsilon_lower_bound"])
    return CurvePoint(
        sigma=record["noise_multiplier"],
        claimed=record["epsilon_claimed"],
        one_run=estimator(record, "one-run"),
        fdp=estimator(record, "one-run-f-dp-gaussian"),
        tpr=record["tpr_at_fpr"][score]["tpr"],
        separation=(scores["in"]["mean"] - scores["out"]["mean"]) / pooled,
        correct=best["correct"],
        guesses=best["guesses"],
        source=path,
    )


def table(points: list[CurvePoint]) -> str:
    """The points as Markdown rows, largest σ first."""
    lines = [
        "| σ | ε claimed | one-run ε_lb | f-DP ε_lb | TPR@1 % | separation | right of 2k "
        "| record |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        sigma = "none" if p.sigma is None else f"{p.sigma:g}"
        claimed = "not private" if p.claimed is None else f"{p.claimed:.4g}"
        lines.append(
            f"| {sigma} | {claimed} | {p.one_run:.3f} | {p.fdp:.3f} | {p.tpr:.3f} | "
            f"{p.separation:.2f} | {p.correct} of {p.guesses} | {p.source} |"
        )
    return "\n".join(lines)


def plot(points: list[CurvePoint], path: Path) -> None:
    """Both bounds against σ on a log axis; a run without noise sits a decade left of the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noised = [p.sigma for p in points if p.sigma is not None]
    floor = min(noised) / 10 if noised else 1.0
    xs = [floor if p.sigma is None else p.sigma for p in points]
    figure, axes = plt.subplots(figsize=(6, 3.6))
    axes.plot(xs, [p.one_run for p in points], "o-", label="one-run ε_lb")
    axes.plot(xs, [p.fdp for p in points], "s--", label="f-DP (Gaussian) ε_lb")
    axes.set_xscale("log")
    unnoised = any(p.sigma is None for p in points)
    axes.set_xlabel("noise multiplier σ" + (" (leftmost: no noise)" if unnoised else ""))
    axes.set_ylabel("ε lower bound")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path, help="audit.json files")
    parser.add_argument("--score", default="white-box-match")
    parser.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    args = parser.parse_args()
    points = [curve_point(path, args.score) for path in args.records]
    points.sort(key=lambda p: -1.0 if p.sigma is None else p.sigma, reverse=True)
    print(table(points))
    if args.plot:
        plot(points, args.plot)


if __name__ == "__main__":
    main()
