"""The report's tables, as Arrow tables (mean and std columns; ``markdown`` writes them out).

- scaling: task metric by model size × budget (zero-shot, each private algorithm and ε,
  each non-private algorithm), mean ± std over seeds, as in DP-ZO's model-size table;
- privacy gap: non-private minus private, by model size and ε;
- resources: peak memory and step time by model size and algorithm;
- step memory: what one step needs above the weights, measured or planned, by model and algorithm;
- cost: the task metric beside the steps and forward passes each budget spent.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from privzo.forward_memory import dtype_bytes

ZERO_SHOT = "zero-shot"


def budget_label(algorithm: str, private: bool, epsilon: float | None, directions: int = 1) -> str:
    """``dpzero ε=2``, ``mezo (non-private)``; an arm with K > 1 directions per step as
    ``dpzero K=16 ε=2``, so it is never averaged with the one-direction arm."""
    arm = algorithm if directions == 1 else f"{algorithm} K={directions}"
    return f"{arm} ε={epsilon:g}" if private else f"{arm} (non-private)"


def _frame(runs: pa.Table) -> pd.DataFrame:
    frame = runs.to_pandas()
    frame["budget"] = [
        budget_label(a, p, e, int(k))
        for a, p, e, k in zip(
            frame["algorithm"],
            frame["private"],
            frame["epsilon_target"],
            frame["directions"],
            strict=True,
        )
    ]
    return frame


def _budget_order(frame: pd.DataFrame) -> list[str]:
    private = frame[frame["private"]].sort_values(["algorithm", "directions", "epsilon_target"])
    public = frame[~frame["private"]].sort_values(["algorithm", "directions"])
    return [ZERO_SHOT, *dict.fromkeys(private["budget"]), *dict.fromkeys(public["budget"])]


def scaling_table(runs: pa.Table) -> pa.Table:
    """One row per (task, model, budget): mean, std and count of the metric over seeds.

    Zero-shot is the base model's score before training; every trained run of a (task, model,
    seed) measures it on the same test split, so it counts once per seed.
    """
    frame = _frame(runs)
    if frame.empty:
        return pa.Table.from_pandas(_empty_scaling(), preserve_index=False)
    zero_shot = (
        frame.dropna(subset=["metric_before"])
        .drop_duplicates(subset=["task", "model", "seed"])
        .assign(budget=ZERO_SHOT, value=lambda f: f["metric_before"])
    )
    trained = frame.assign(value=frame["metric_after"])
    combined = pd.concat([zero_shot, trained], ignore_index=True)
    keys = ["task", "metric", "model", "model_parameters", "budget"]
    grouped = combined.groupby(keys, dropna=False)["value"]
    table = grouped.agg(mean="mean", std="std", seeds="count").reset_index()
    table["budget"] = pd.Categorical(table["budget"], _budget_order(frame), ordered=True)
    table = table.sort_values(["task", "model_parameters", "budget"]).reset_index(drop=True)
    table["budget"] = table["budget"].astype(str)
    return pa.Table.from_pandas(table, preserve_index=False)


def _empty_scaling() -> pd.DataFrame:
    columns = ["task", "metric", "model", "model_parameters", "budget", "mean", "std", "seeds"]
    return pd.DataFrame(columns=columns)


def privacy_gap_table(scaling: pa.Table) -> pa.Table:
    """Non-private mean minus private mean, for each model and each private budget (against
    each non-private algorithm); ``seeds``: the fewer of the two means' seed counts."""
    frame = scaling.to_pandas()
    rows = []
    for (task, model, size), group in frame.groupby(["task", "model", "model_parameters"]):
        means = dict(zip(group["budget"], group["mean"], strict=True))
        seeds = dict(zip(group["budget"], group["seeds"], strict=True))
        public = [b for b in means if b.endswith("(non-private)")]
        private = [b for b in means if "ε=" in b]
        for reference in public:
            for budget in private:
                gap = means[reference] - means[budget]
                rows.append(
                    {
                        "task": task,
                        "model": model,
                        "model_parameters": size,
                        "private": budget,
                        "non_private": reference,
                        "gap": gap,
                        "seeds": int(min(seeds[reference], seeds[budget])),
                    }
                )
    columns = ["task", "model", "model_parameters", "private", "non_private", "gap", "seeds"]
    table = pd.DataFrame(rows, columns=columns).sort_values(["task", "model_parameters"])
    return pa.Table.from_pandas(table.reset_index(drop=True), preserve_index=False)


def forward_passes(runs: pa.Table) -> list[int | None]:
    """Per run, the forward passes a zeroth-order step algorithm spends: 2 × batch × K × steps
    (two loss evaluations per example and direction; the expected batch of a Poisson run).
    None for algorithms that take no such step (first-order, DPGD-0th)."""
    from privzo.algorithms.registry import names

    stepping = set(names(directions=True))
    return [
        2 * batch * k * steps if algorithm in stepping and batch and steps else None
        for algorithm, batch, k, steps in zip(
            runs.column("algorithm").to_pylist(),
            runs.column("batch_size").to_pylist(),
            runs.column("directions").to_pylist(),
            runs.column("steps").to_pylist(),
            strict=True,
        )
    ]


def cost_table(runs: pa.Table) -> pa.Table:
    """One row per (task, model, budget): the steps, directions and forward passes its runs
    spent beside the metric's mean, std and count over seeds."""
    frame = _frame(runs)
    columns = [
        "task",
        "metric",
        "model",
        "model_parameters",
        "budget",
        "steps",
        "directions",
        "forward_passes",
        "mean",
        "std",
        "seeds",
    ]
    if frame.empty:
        return pa.Table.from_pandas(pd.DataFrame(columns=columns), preserve_index=False)
    frame["forward_passes"] = pd.array(forward_passes(runs), dtype="Int64")
    keys = ["task", "metric", "model", "model_parameters", "budget"]
    table = (
        frame.groupby(keys, dropna=False)
        .agg(
            steps=("steps", "max"),
            directions=("directions", "max"),
            forward_passes=("forward_passes", "max"),
            mean=("metric_after", "mean"),
            std=("metric_after", "std"),
            seeds=("metric_after", "count"),
        )
        .reset_index()
    )
    table["budget"] = pd.Categorical(table["budget"], _budget_order(frame), ordered=True)
    table = table.sort_values(["task", "model_parameters", "budget"]).reset_index(drop=True)
    table["budget"] = table["budget"].astype(str)
    return pa.Table.from_pandas(table[columns], preserve_index=False)


def resources_table(runs: pa.Table) -> pa.Table:
    """Peak memory and mean step time by model and algorithm (means over runs).

    Private runs do not release these figures (they follow the sampled records) unless
    diagnostics were on, so a private algorithm's cells are usually null; ``private`` says so.
    """
    frame = runs.to_pandas()
    keys = ["model", "model_parameters", "algorithm"]
    table = (
        frame.groupby(keys)
        .agg(
            private=("private", "any"),
            peak_memory_mb=("peak_memory_mb", "mean"),
            step_peak_memory_mb=("step_peak_memory_mb", "mean"),
            mean_step_time_s=("mean_step_time_s", "mean"),
            runs=("run_id", "count"),
        )
        .reset_index()
        .sort_values(["model_parameters", "algorithm"])
    )
    return pa.Table.from_pandas(table.reset_index(drop=True), preserve_index=False)


MEASURED = "allocator peak − weights (CUDA)"
PLANNED = "planner's estimate"
STEP_MEMORY_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("model_parameters", pa.int64()),
        ("algorithm", pa.string()),
        ("source", pa.string()),  # MEASURED or PLANNED
        ("step_memory_mb", pa.float64()),  # mean over the runs with a figure
        ("std", pa.float64()),  # over those runs; null for one
        ("seeds", pa.int64()),  # runs with a figure
    ]
)


def step_memory_table(runs: pa.Table) -> pa.Table:
    """What one step needs above the weights, by model and algorithm: the CUDA allocator's
    step peak minus the weights where runs measured it (a whole model per GPU), else the
    planner's estimate. Never a CPU peak: that is the whole process's resident memory."""
    frame = runs.to_pandas()
    frame["measured_mb"] = [_above_weights(row) for row in frame.itertuples()]
    keys = ["model", "model_parameters", "algorithm"]
    rows = [
        _step_memory_row(dict(zip(keys, key, strict=True)), group)
        for key, group in frame.groupby(keys)
    ]
    found = sorted(
        (row for row in rows if row is not None),
        key=lambda row: (row["model_parameters"], row["algorithm"]),
    )
    return pa.Table.from_pylist(found, schema=STEP_MEMORY_SCHEMA)


def _step_memory_row(keys: dict[str, Any], group: pd.DataFrame) -> dict[str, Any] | None:
    """One model and algorithm's row: its measured figures if any run has one, else its
    planned ones; None where it has neither."""
    measured = group["measured_mb"].dropna()
    planned = group["planned_step_mb"].dropna()
    source, values = (MEASURED, measured) if len(measured) else (PLANNED, planned)
    if not len(values):
        return None
    return keys | {
        "source": source,
        "step_memory_mb": float(values.mean()),
        "std": float(values.std()) if len(values) > 1 else None,
        "seeds": len(values),
    }


def _above_weights(run: Any) -> float | None:
    """A run's CUDA step peak minus its weights (parameters × dtype), in MiB; None off CUDA,
    under zero3 (a GPU holds a shard, not the weights) or where the peak was withheld."""
    peak = run.step_peak_memory_mb
    if run.device != "cuda" or run.strategy == "zero3" or run.dtype is None or pd.isna(peak):
        return None
    return float(peak) - run.model_parameters * dtype_bytes(run.dtype) / 2**20


SAMPLER_MEANING = {
    "poisson": "Poisson, from secret randomness (what the accountant assumes)",
    "shuffle": "seeded shuffle, fixed-size batches (repeatable)",
}


CELL_COLUMNS = [
    "run_name",
    "model",
    "model_parameters",
    "task",
    "algorithm",
    "epsilon_target",
    "seed",
    "steps",
    "metric",
    "metric_before",
    "metric_after",
    "epsilon",
    "delta",
    "run_id",
]
"""The per-run comparison's columns: what tells runs apart, then what each scored and spent.
No time or memory figure: a private run's follow which records were sampled."""


def cells_table(runs: pa.Table) -> pa.Table:
    """One row per run (a study's cells side by side, seeds apart), smallest model first,
    then by algorithm, budget and seed."""
    keys = [("model_parameters", "ascending"), ("algorithm", "ascending")]
    keys += [("epsilon_target", "ascending"), ("seed", "ascending")]
    return runs.select(CELL_COLUMNS).sort_by(keys)


def sampling_table(runs: pa.Table) -> pa.Table:
    """How each arm drew its batches: private arms Poisson, non-private baselines a seeded
    shuffle (a study sets it), so a baseline's score repeats from run to run."""
    frame = runs.to_pandas()
    columns = ["algorithm", "private", "sampler", "runs"]
    if frame.empty:
        return pa.Table.from_pandas(pd.DataFrame(columns=columns), preserve_index=False)
    frame["sampler"] = frame["sampler"].fillna("not recorded")
    table = (
        frame.groupby(["algorithm", "private", "sampler"])
        .agg(runs=("run_id", "count"))
        .reset_index()
        .sort_values(["private", "algorithm"], ascending=[False, True])
    )
    table["sampler"] = [SAMPLER_MEANING.get(name, name) for name in table["sampler"]]
    return pa.Table.from_pandas(table[columns].reset_index(drop=True), preserve_index=False)


def audit_table(audits: pa.Table) -> pa.Table:
    """Audited ε against claimed ε by model and budget: one row per audit (seeds apart, since
    each bound holds for its own run)."""
    frame = audits.to_pandas()
    if frame.empty:
        return pa.table({"model": pa.array([], pa.string())})
    claimed = frame["epsilon_claimed"]
    out = pd.DataFrame(
        {
            "model": frame["model"],
            "model_parameters": frame["model_parameters"],
            "budget": [
                budget_label(a, p, e, int(k))
                for a, p, e, k in zip(
                    frame["algorithm"],
                    frame["private"],
                    frame["epsilon_target"],
                    frame["directions"],
                    strict=True,
                )
            ],
            "seed": frame["seed"],
            "epsilon_claimed": claimed,
            "epsilon_lower_bound": frame["epsilon_lower_bound"],
            "tightness": frame["epsilon_lower_bound"] / claimed.where(claimed > 0),
            "verdict": frame["verdict"],
            "canaries": frame["canaries"],
            "k": frame["k"],
            "correct": [
                f"{c}/{g}" for c, g in zip(frame["correct"], frame["guesses"], strict=True)
            ],
            "alpha": frame["alpha"],
        }
    )
    return pa.Table.from_pandas(out, preserve_index=False)
