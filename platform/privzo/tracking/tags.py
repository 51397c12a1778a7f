"""The tags a privzo run carries, by name, and the functions that set them.

One module for writers (the run pipeline, the Ray launcher and its rank 0) and for readers
(``privzo.analysis.runs``), so a tag is never spelled twice. The MLflow UI groups and compares
runs by them (model size, ε, algorithm, task).
"""

from __future__ import annotations

from privzo.config.run import RunConfig

MODEL = "privzo.model"
MODEL_PARAMETERS = "privzo.model_parameters"
TRAINABLE_PARAMETERS = "privzo.trainable_parameters"
TASK = "privzo.task"
METRIC = "privzo.metric"
ALGORITHM = "privzo.algorithm"
PRIVATE = "privzo.private"
EPSILON = "privzo.epsilon"
STRATEGY = "privzo.strategy"
WORKERS = "privzo.workers"
ROLE = "privzo.role"  # 'search' or 'study' on a parent run; absent on a run
STUDY = "privzo.study"
CELL = "privzo.cell"
SEED = "privzo.seed"
AUDIT = "privzo.audit"  # 'true' on an audited run (trained with canaries) and on its audit
AUDIT_VERDICT = "privzo.audit.verdict"  # on the audit (the audited run's MLflow child)
MODEL_REVISION = "privzo.model_revision"  # the hub commit of the base model (hub ids only)
ADAPTER_URI = "privzo.adapter_uri"  # a LoRA / prefix run's adapter (transformers flavor), if logged
MODEL_URI = "privzo.model_uri"  # the run's fine-tuned model (``runs:/<id>/model``), if logged
BEST_MODEL_URI = "privzo.best_model_uri"  # on a search's parent run: the best trial's model
DEVICE = "privzo.device"  # the device type the model ran on ('cuda', 'cpu'): what a peak measures
# the planner's estimate of what one step needs above the weights, in MiB (decoders it models)
PLANNED_STEP_MB = "privzo.planned_step_mb"
# on a resumed run's new tracking run (its earlier one lost with its store): the steps kept
CONTINUES_FROM_STEP = "privzo.continues_from_step"
# MLflow's own tag that nests a run under another: a search's trial, a study's cell, an audit
PARENT_RUN = "mlflow.parentRunId"
SEARCH = "privzo.search"  # on a search's trial: the search's name
TRIAL = "privzo.trial"  # on a search's trial: its Tune trial id


def config_tags(config: RunConfig, private: bool) -> dict[str, str]:
    """Tags known from the config and the privacy plan alone, before any model is loaded."""
    tags = {
        MODEL: config.model.name_or_path,
        TASK: config.task.name,
        ALGORITHM: config.optimizer.algorithm,
        PRIVATE: str(private).lower(),
        SEED: str(config.seed),
    }
    if private:
        tags[EPSILON] = f"{config.privacy.epsilon:g}"
    return tags


def run_label(config: RunConfig) -> str:
    """The run's default MLflow name, in full: algorithm and ε first (what runs are told apart
    by, and what a narrow name column keeps), then the model and the seed (what a study's cells
    differ in), then the task (often one name, and long, for all of them)."""
    optimizer = config.optimizer
    budget = f"ε={config.privacy.epsilon:g}" if optimizer.is_private else "non-private"
    return (
        f"{optimizer.algorithm} {budget} {config.model.name_or_path} seed={config.seed} "
        f"{config.task.name}"
    )


def model_tags(
    metric: str,
    model_parameters: int,
    trainable_parameters: int,
    model_revision: str | None = None,
    device: str | None = None,
    planned_step_mb: float | None = None,
) -> dict[str, str]:
    """Tags known once the model and task are built (sizes, the task's metric, the hub commit
    the base model was loaded at, the device and the step's planned memory)."""
    tags = {
        MODEL_PARAMETERS: str(model_parameters),
        METRIC: metric,
        TRAINABLE_PARAMETERS: str(trainable_parameters),
    }
    optional = {MODEL_REVISION: model_revision, DEVICE: device}
    if planned_step_mb is not None:
        optional[PLANNED_STEP_MB] = f"{planned_step_mb:.3f}"
    tags.update({key: value for key, value in optional.items() if value is not None})
    return tags


def layout_tags(config: RunConfig) -> dict[str, str]:
    """Tags of a distributed run's layout."""
    return {STRATEGY: config.parallel.strategy, WORKERS: str(config.parallel.workers)}
