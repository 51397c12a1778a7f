"""The ``tracking`` section of a run config: where a run's parameters and metrics are logged."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from privzo.section import Section

__all__ = ["TrackingConfig"]


class TrackingConfig(Section):
    backend: Literal["mlflow", "none"] = "mlflow"
    uri: str | None = Field(None, description="Tracking URI; null = sqlite under the output root.")
    experiment: str = "privzo"
    run_name: str | None = None
    log_every: int = Field(10, ge=1)
    log_private_diagnostics: bool = Field(
        False,
        description="Log a private run's training loss, step times and non-finite / empty-batch "
        "counts. They depend on the private data and are not covered by the run's guarantee, "
        "so they are off by default (the progress bar still shows them on the console).",
    )
