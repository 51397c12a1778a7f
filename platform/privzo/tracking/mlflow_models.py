"""The MLflow model formats a run is saved in: a pyfunc model privzo loads itself, and the
transformers flavor's PEFT form for a LoRA or prefix adapter.

Both are written with explicit requirements, so MLflow neither loads the model nor probes the
environment to infer them.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path
from typing import Any

__all__ = ["save_adapter_model", "save_pyfunc_model"]

logger = logging.getLogger(__name__)


def _installed(*packages: str) -> list[str]:
    """Pins of the installed ``packages`` (a model's requirements, stated, not inferred)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in packages]


def save_pyfunc_model(path: Path, data_dir: Path, loader_module: str) -> bool:
    """MLflow's ``loader_module`` form at ``path``: ``mlflow.pyfunc.load_model`` imports
    ``loader_module`` and calls its ``_load_pyfunc`` on the data; privzo is its requirement."""
    import mlflow.pyfunc

    from privzo import __version__

    mlflow.pyfunc.save_model(
        path=str(path),
        loader_module=loader_module,
        data_path=str(data_dir),
        pip_requirements=[f"privzo=={__version__}"],
    )
    return True


def save_adapter_model(
    path: Path, model: Any, tokenizer: Any, task: str, base_path: str | None
) -> bool:
    """The transformers flavor's PEFT form at ``path``: ``peft/`` holds the adapter, the base is
    referenced (``base_model_path`` for a local one), and ``mlflow.transformers.load_model``
    returns the PeftModel. False, with a warning, where MLflow cannot save it: the run's other
    records are kept."""
    import mlflow.transformers
    from mlflow.exceptions import MlflowException

    try:
        mlflow.transformers.save_model(
            {"model": model, "tokenizer": tokenizer},
            path=str(path),
            task=task,
            base_model_path=base_path,
            pip_requirements=_installed("torch", "transformers", "peft"),
        )
    except (MlflowException, OSError, ValueError) as error:
        logger.warning("the adapter was not logged as an MLflow model: %s", error)
        return False
    return True
