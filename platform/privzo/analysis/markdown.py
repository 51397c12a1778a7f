"""The report's tables as Markdown: every cell formatted by its column (counts with
thousands separators, floats to four significant digits unless a table says otherwise), a
private algorithm's unreleased figure written as withheld, the scaling table pivoted by budget."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa

__all__ = [
    "COLUMN_FORMATS",
    "WITHHELD",
    "frame_markdown",
    "markdown",
    "resources_markdown",
    "scaling_markdown",
]

WITHHELD = "withheld"


# Columns every Markdown table formats the same way (122,304 parameters, as in the scaling table).
COLUMN_FORMATS = {"model_parameters": ","}


def resources_markdown(resources: pa.Table) -> str:
    """The resources table as Markdown; a private algorithm's missing figure reads withheld."""
    frame = resources.to_pandas()
    formats = {"peak_memory_mb": ".1f", "step_peak_memory_mb": ".1f", "mean_step_time_s": ".4f"}
    for column, spec in formats.items():
        frame[column] = [
            WITHHELD if private and math.isnan(value) else _cell(value, spec)
            for private, value in zip(frame["private"], frame[column], strict=True)
        ]
    return frame_markdown(pa.Table.from_pandas(frame, preserve_index=False))


def scaling_markdown(scaling: pa.Table) -> str:
    """The scaling table as Markdown: a row per (task, model), a column per budget."""
    frame = scaling.to_pandas()
    if frame.empty:
        return "_no finished runs_\n"
    budgets = list(dict.fromkeys(frame["budget"]))
    rows = []
    for (task, size, model), group in frame.groupby(["task", "model_parameters", "model"]):
        cells = dict(
            zip(group["budget"], zip(group["mean"], group["std"], strict=True), strict=True)
        )
        values = [_mean_std(*cells[b]) if b in cells else "-" for b in budgets]
        rows.append([task, model, f"{int(size):,}", *values])
    return markdown(pd.DataFrame(rows, columns=["task", "model", "parameters", *budgets]))


def markdown(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown (pipe) table by pandas' ``to_markdown``, its cells as given:
    numbers are formatted by the caller, so tabulate must not re-parse them."""
    return frame.astype(str).to_markdown(index=False, disable_numparse=True) + "\n"


def frame_markdown(table: pa.Table, formats: dict[str, str] | None = None) -> str:
    frame = table.to_pandas()
    if frame.empty:
        return "_none_\n"
    formats = COLUMN_FORMATS | (formats or {})
    cells = {
        column: [_cell(value, formats.get(column)) for value in frame[column]]
        for column in frame.columns
    }
    return markdown(pd.DataFrame(cells, columns=frame.columns))


def _mean_std(mean: float, std: float) -> str:
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {std:.3f}"


def _cell(value: object, spec: str | None) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else format(value, spec or ".4g")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and spec:
        return format(int(value), spec)
    return str(value)
