"""Run the synthetic quadratic study: sweep, select, tabulate, plot.

For each (pattern, dimension, seed) one dataset is drawn; each algorithm runs its whole
learning-rate × clipping grid on it at once (see algorithms.py). The best grid point per
(pattern, dimension, algorithm) is the one with the lowest final gradient norm averaged over
seeds. That selection looks at the private training data and is not itself private (the paper's
synthetic experiment selects the same way): the table shows what each algorithm reaches with
well-chosen hyperparameters, not an end-to-end private result.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privzo.privacy import AccountingQuery, calibrate
from privzo.results import RecordKeys
from privzo.synthetic.algorithms import run_algorithm
from privzo.synthetic.config import SyntheticStudyConfig
from privzo.synthetic.quadratic import make_problem
from privzo.tracking import Tracker

__all__ = [
    "FIGURE_NAME",
    "RESULTS_NAME",
    "TABLE_NAME",
    "SyntheticStudyResult",
    "run_synthetic_study",
    "select_best",
    "study_noise_multiplier",
]

RESULTS_NAME = "synthetic_results.parquet"
TABLE_NAME = "synthetic_table.md"
FIGURE_NAME = "synthetic_gradient_norm.png"
BEST_TABLE_NAME = "synthetic_best.json"  # the selected rows, as an MLflow table


def study_noise_multiplier(config: SyntheticStudyConfig) -> float:
    """σ for ``steps`` full-batch (sampling rate 1) Gaussian releases at the study's (ε, δ).

    The same σ serves all three algorithms: each release has ℓ2 sensitivity C and noise σC per
    coordinate, and a d-dimensional Gaussian mechanism with ℓ2 sensitivity C has the privacy
    loss of the 1-D one with sensitivity C.
    """
    query = AccountingQuery(
        sample_rate=1.0,
        steps=config.steps,
        delta=config.privacy.delta,
        mechanism="gaussian",
        accountant=config.privacy.accountant,
    )
    return calibrate(query, config.privacy.epsilon)


def _grid_points(config: SyntheticStudyConfig, algorithm: str) -> tuple[np.ndarray, np.ndarray]:
    grid = config.grid_for(algorithm)
    pairs = list(itertools.product(grid.learning_rates, grid.clip_thresholds))
    return np.array([lr for lr, _ in pairs]), np.array([clip for _, clip in pairs])


def _work_units(config: SyntheticStudyConfig) -> list[tuple[str, int, int]]:
    return list(itertools.product(config.patterns, config.dimensions, config.seeds))


def _run_unit(
    config: SyntheticStudyConfig, pattern: str, dimension: int, seed: int, sigma: float
) -> list[dict[str, Any]]:
    """Every algorithm's grid on one (pattern, dimension, seed) dataset: one row per grid point."""
    problem = make_problem(
        pattern, dimension, config.dataset_size, seed, mean=config.data_mean, std=config.data_std
    )
    rows: list[dict[str, Any]] = []
    for algorithm in config.algorithms:
        learning_rates, clips = _grid_points(config, algorithm)
        directions = config.directions_per_step if algorithm == "dpzero" else 1
        started = time.perf_counter()
        result = run_algorithm(
            algorithm,
            problem,
            learning_rates,
            clips,
            steps=config.steps,
            noise_multiplier=sigma,
            seed=seed,
            directions_per_step=directions,
        )
        seconds = time.perf_counter() - started
        for k in range(len(learning_rates)):
            rows.append(
                {
                    "pattern": pattern,
                    "effective_rank": problem.effective_rank,
                    "dimension": dimension,
                    "algorithm": algorithm,
                    "seed": seed,
                    "learning_rate": float(learning_rates[k]),
                    "clip_threshold": float(clips[k]),
                    "steps": config.steps,
                    "directions_per_step": directions,
                    "dataset_size": config.dataset_size,
                    "noise_multiplier": sigma,
                    "epsilon": config.privacy.epsilon,
                    "delta": config.privacy.delta,
                    "initial_gradient_norm": result.initial_gradient_norm,
                    "final_gradient_norm": float(result.final_gradient_norm[k]),
                    "final_loss": float(result.final_loss[k]),
                    "diverged": bool(result.diverged[k]),
                    "grid_seconds": seconds,
                }
            )
    return rows


def select_best(results: pd.DataFrame) -> pd.DataFrame:
    """Per (pattern, dimension, algorithm): the grid point with the lowest mean final gradient
    norm over seeds (a diverged seed makes the point's mean infinite), with mean and std."""
    keys = ["pattern", "dimension", "algorithm"]
    per_point = (
        results.groupby([*keys, "learning_rate", "clip_threshold"], sort=False)
        .agg(
            effective_rank=("effective_rank", "first"),
            mean=("final_gradient_norm", "mean"),
            std=("final_gradient_norm", lambda values: float(np.std(values, ddof=0))),
            loss_mean=("final_loss", "mean"),
            seeds=("seed", "nunique"),
        )
        .reset_index()
    )
    best = per_point.loc[per_point.groupby(keys, sort=False)["mean"].idxmin()]
    return best.sort_values(keys).reset_index(drop=True)


def _format_cell(mean: float, std: float) -> str:
    if not math.isfinite(mean):
        return "diverged"
    return f"{readable(mean, 3)} ± {readable(std, 2)}"


def readable(value: float, digits: int) -> str:
    """``digits`` significant digits, without the exponent that ``g`` gives at 10^digits and up
    (1000 reads 1,000, not 1e+03); small values keep ``g``."""
    if math.isfinite(value) and abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _markdown_table(best: pd.DataFrame, config: SyntheticStudyConfig, sigma: float) -> str:
    lines = [
        "# Synthetic quadratic study: final gradient norm ‖∇F(x_T)‖ by dimension",
        "",
        f"(ε, δ) = ({config.privacy.epsilon:g}, {config.privacy.delta:g}), full batch "
        f"n = {config.dataset_size}, T = {config.steps} steps, σ = {sigma:.4g} "
        f"({config.privacy.accountant}), seeds {config.seeds}.",
        "",
        "Each cell: mean ± std over seeds at the learning rate and clipping threshold with the "
        "lowest mean (shown as η, C). **This hyperparameter selection uses the training data and "
        "is not private**, as in the DPZero paper's synthetic experiment; the numbers show what "
        "each algorithm reaches when tuned, not an end-to-end (ε, δ) result.",
        "",
    ]
    for pattern in config.patterns:
        rows = best[best["pattern"] == pattern]
        lines += [f"## {pattern}", ""]
        header = ["d", "tr(A)/‖A‖", *config.algorithms]
        table = [_dimension_row(group, config.algorithms) for _, group in rows.groupby("dimension")]
        frame = pd.DataFrame(table, columns=header)
        lines += [frame.to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(lines)


def _dimension_row(group: pd.DataFrame, algorithms: Sequence[str]) -> list[str]:
    """One dimension's cells: d, the effective rank, then each algorithm's tuned result."""
    cells = [str(group["dimension"].iloc[0]), readable(group["effective_rank"].iloc[0], 3)]
    for algorithm in algorithms:
        match = group[group["algorithm"] == algorithm]
        if match.empty:
            cells.append("")
            continue
        item = match.iloc[0]
        cells.append(
            f"{_format_cell(item['mean'], item['std'])} "
            f"(η={item['learning_rate']:g}, C={item['clip_threshold']:g})"
        )
    return cells


def _plot(
    best: pd.DataFrame, config: SyntheticStudyConfig, path: Path, tracker: Tracker | None
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    from matplotlib import pyplot as plt

    patterns = list(config.patterns)
    figure, axes = plt.subplots(1, len(patterns), figsize=(4.2 * len(patterns), 3.6), squeeze=False)
    for axis, pattern in zip(axes[0], patterns, strict=True):
        rows = best[best["pattern"] == pattern]
        for algorithm in config.algorithms:
            line = rows[(rows["algorithm"] == algorithm) & np.isfinite(rows["mean"])]
            line = line.sort_values("dimension")
            axis.errorbar(
                line["dimension"],
                line["mean"],
                yerr=line["std"],
                marker="o",
                capsize=3,
                label=algorithm,
            )
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(pattern)
        axis.set_xlabel("dimension d")
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("final ‖∇F(x_T)‖ (best η, C; non-private selection)")
    axes[0][0].legend()
    figure.suptitle(
        f"(ε, δ) = ({config.privacy.epsilon:g}, {config.privacy.delta:g}), "
        f"n = {config.dataset_size}, T = {config.steps}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    if tracker is not None:
        tracker.log_figure(figure, path.name)
    plt.close(figure)


@dataclass(frozen=True)
class SyntheticStudyResult(RecordKeys):
    """The study's noise multiplier, its selected rows, the files it wrote and its run time."""

    noise_multiplier: float
    rows: list[dict[str, Any]]  # the best grid point of each algorithm, pattern and dimension
    results_path: Path  # every run (parquet)
    table_path: Path  # the selected rows (markdown)
    figure_path: Path
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_synthetic_study(
    config: SyntheticStudyConfig,
    output_dir: Path,
    progress: bool = True,
    tracker: Tracker | None = None,
) -> SyntheticStudyResult:
    """Run the sweep and write the parquet of every run, the markdown table and the figure;
    with a ``tracker``, the selected rows go to it as a table and the figure as a figure."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sigma = study_noise_multiplier(config)
    units = _work_units(config)
    rows: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(units), desc="synthetic study", unit="dataset")
    for pattern, dimension, seed in units:
        if bar is not None:
            bar.set_postfix_str(f"{pattern} d={dimension} seed={seed}")
        rows += _run_unit(config, pattern, dimension, seed, sigma)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    results = pd.DataFrame(rows)
    results_path = output_dir / RESULTS_NAME
    results.to_parquet(results_path, index=False)
    best = select_best(results)
    table_path = output_dir / TABLE_NAME
    table_path.write_text(_markdown_table(best, config, sigma))
    figure_path = output_dir / FIGURE_NAME
    _plot(best, config, figure_path, tracker)
    if tracker is not None:
        tracker.log_table(best, BEST_TABLE_NAME)
    return SyntheticStudyResult(
        noise_multiplier=sigma,
        rows=best.to_dict(orient="records"),
        results_path=results_path,
        table_path=table_path,
        figure_path=figure_path,
        seconds=time.perf_counter() - started,
    )
