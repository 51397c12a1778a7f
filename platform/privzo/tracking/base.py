"""Backend-neutral experiment-tracking interface.

Training and analysis code talk to a :class:`Tracker` only, so a run can go to MLflow, to nothing
(unit tests, dry runs) or to a future backend without touching the training loop.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    import pandas as pd

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
"""Terminal states a run can end in (the MLflow names, which other backends map onto)."""

_TrackerT = TypeVar("_TrackerT", bound="Tracker")


class TrackingStoreError(OSError):
    """The tracking store stopped taking a run's records mid-run (a full disk, a store deleted,
    replaced or made unwritable): an ``OSError``, so commands end in one line, as for a file."""


class TrackingRunLostError(TrackingStoreError):
    """The store no longer holds the run a resumed run would go on with (a store deleted or
    replaced since): the resumed run records into a new one."""


@dataclass(frozen=True)
class MetricPoint:
    """One metric value at a step, as a run logs it (its time is the tracker's to stamp)."""

    key: str
    value: float
    step: int


def is_metric_point(value: object) -> bool:
    """Whether ``value`` is ``{key: text, value: number, step: count}``: a ``MetricPoint`` as
    a saved record (a resume point, a checkpoint) holds it."""
    if not isinstance(value, dict) or set(value) != {"key", "value", "step"}:
        return False
    key, number, step = value["key"], value["value"], value["step"]
    return (
        isinstance(key, str)
        and isinstance(number, int | float)
        and not isinstance(number, bool)
        and isinstance(step, int)
        and not isinstance(step, bool)
        and step >= 0
    )


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into ``{"a.b.c": "value"}``.

    Tracking backends store flat string key/value pairs; dotted keys keep the config structure
    readable and searchable (``params.optim.lr``). Empty mappings are kept as ``"{}"`` so a key
    that exists in the config never silently disappears from the record.
    """
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{name}."))
        elif isinstance(value, Mapping):
            flat[name] = "{}"
        else:
            flat[name] = str(value)
    return flat


@dataclass(frozen=True)
class DatasetLineage:
    """Where a run's data came from, by public identifiers only: a hub id, subset, split and
    revision, or a file path. Its digest is a hash of those identifiers, never of the rows (a
    digest or profile of private data would be a release the accountant does not cover)."""

    name: str
    source_type: str  # "hugging_face", "local" or "privzo" (a built-in dataset)
    source: Mapping[str, str | None]
    context: str  # the split's role: "train" (private in a private run) or "test"

    @property
    def digest(self) -> str:
        identifiers = json.dumps([self.source_type, dict(self.source)], sort_keys=True)
        return hashlib.sha256(identifiers.encode()).hexdigest()[:16]


def check_artifact_file(artifact_file: str, suffix: str) -> str:
    """A relative artifact path ending in ``suffix``: what every backend accepts, checked the
    same way by all of them (the no-op one included) so a bad name fails in tests too."""
    path = Path(artifact_file)
    if path.is_absolute() or ".." in path.parts or path.suffix != suffix:
        raise ValueError(
            f"artifact file must be a relative path ending in {suffix}: {artifact_file!r}"
        )
    return path.as_posix()


class Tracker(abc.ABC):
    """One tracked run: parameters, step metrics, tags and artifacts.

    Usage::

        with make_tracker("mlflow", uri=None, experiment="e", output_root=root, run_name="r") as t:
            t.log_params(config)
            t.log_metrics({"loss": 0.3}, step=1)

    As a context manager it starts the run on entry and on exit ends it ``FINISHED``, ``FAILED``
    (exception) or ``KILLED`` (``KeyboardInterrupt``), always flushing buffered metrics first, so
    the values logged before a crash are kept for the post-mortem. Not thread-safe: log from one
    thread (rank 0) per run.
    """

    def connect(self) -> None:  # noqa: B027 - a no-op is right for stores that need no setup
        """Reach the backing store without creating a run (to fail early on a bad store)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Create the run in the backend; logging before this is an error."""

    @abc.abstractmethod
    def attach(self, run_id: str) -> None:
        """Reopen the existing run ``run_id`` (to resume it) instead of creating one."""

    @property
    @abc.abstractmethod
    def run_id(self) -> str | None:
        """Backend run id, or ``None`` before :meth:`start` or for a backend without runs."""

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """True between :meth:`start` and :meth:`finish`."""

    @abc.abstractmethod
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the resolved configuration (nested mappings are flattened with dots).

        Parameters are for configuration only, never for data: backends store them as short
        immutable strings.
        """

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar metrics at ``step``; backends may buffer until :meth:`flush`."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Send any buffered metrics now."""

    @abc.abstractmethod
    def unsent(self) -> tuple[MetricPoint, ...]:
        """The metrics logged but not yet stored (buffered): what a run keeps beside its steps,
        so a kill loses none of them."""

    def unsent_with(self, metrics: Mapping[str, float], step: int) -> tuple[MetricPoint, ...]:
        """The metrics not stored yet, then ``metrics`` about to be logged at ``step``: what a
        saved resume point or checkpoint keeps, so a kill before they are stored loses none."""
        return self.unsent() + tuple(MetricPoint(k, float(v), step) for k, v in metrics.items())

    @abc.abstractmethod
    def metric_steps(self, key: str) -> frozenset[int]:
        """The steps at which the run holds ``key``, stored or buffered: what a resumed run
        checks its record against (empty where the backend records nothing)."""

    @abc.abstractmethod
    def log_missing(self, points: Sequence[MetricPoint]) -> int:
        """Store the ``points`` whose key the run does not hold at their step (an earlier
        attempt's unsent metrics, some of which may have been stored after all); returns how
        many were stored. Each step's value is then held once."""

    @abc.abstractmethod
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file (or a directory, recursively) into the run's artifact store."""

    @abc.abstractmethod
    def log_model(self, data_dir: Path, loader_module: str, name: str = "model") -> str | None:
        """Record ``data_dir`` as a model the backend can load back (MLflow: a pyfunc model
        whose ``loader_module._load_pyfunc(data_path)`` builds it); returns its URI (None where
        the backend keeps no models)."""

    @abc.abstractmethod
    def log_adapter_model(
        self, model: Any, tokenizer: Any, task: str, base_path: str | None, name: str = "adapter"
    ) -> str | None:
        """Record a peft-wrapped ``model`` (LoRA, prefix) as a model of the backend's
        transformers format (MLflow: the ``transformers`` flavor): the adapter's weights and the
        tokenizer, with the base referenced, not copied: by ``base_path`` (a local directory,
        which must exist where the model is loaded) or, when None, by the base's hub id and
        revision. ``task`` is the pipeline's ("text-generation", "fill-mask"). Returns its URI;
        None where the backend keeps no models, or where saving it failed (a warning says why:
        the run's other records are kept)."""

    @abc.abstractmethod
    def log_table(self, table: pd.DataFrame, artifact_file: str) -> None:
        """Record a table as ``artifact_file`` (a ``.json`` path), which the backend's UI shows
        as a table (MLflow: ``log_table``). Only public figures belong here, as in metrics."""

    @abc.abstractmethod
    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Record a matplotlib figure as the image ``artifact_file`` (``.png``), shown in the
        backend's UI (MLflow: ``log_figure``). The caller still owns (and closes) the figure."""

    @abc.abstractmethod
    def log_inputs(self, datasets: Sequence[DatasetLineage]) -> None:
        """Record where the run's data came from (MLflow: ``log_inputs``, the run's Datasets),
        by the identifiers in each :class:`DatasetLineage` and its identifier digest only."""

    @abc.abstractmethod
    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Attach or overwrite string tags (tags, unlike params, may change during a run)."""

    @abc.abstractmethod
    def finish(self, status: RunStatus = "FINISHED") -> None:
        """Flush buffered metrics and end the run; a second call does nothing."""

    def __enter__(self: _TrackerT) -> _TrackerT:
        if not self.active:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.finish(_status_for(exc_type))
        except TrackingStoreError:
            if exc_type is None:
                raise  # a store failing here is the news; else the block's own error is


def _status_for(exc_type: type[BaseException] | None) -> RunStatus:
    """Map how a ``with`` block ended onto a run status."""
    if exc_type is None:
        return "FINISHED"
    if issubclass(exc_type, KeyboardInterrupt):
        return "KILLED"
    return "FAILED"


class NoopTracker(Tracker):
    """Tracker that records nothing, for tests and dry runs; keeps the same call contract."""

    def __init__(
        self,
        *,
        uri: str | None = None,
        experiment: str = "",
        output_root: Path | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        release_timing: bool = True,
    ) -> None:
        self._active = False

    def start(self) -> None:
        self._active = True

    def attach(self, run_id: str) -> None:
        self._active = True

    @property
    def run_id(self) -> str | None:
        return None

    @property
    def active(self) -> bool:
        return self._active

    def log_params(self, params: Mapping[str, Any]) -> None:
        flatten_params(params)  # same input contract as real backends: fail on non-mappings

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def unsent(self) -> tuple[MetricPoint, ...]:
        return ()

    def metric_steps(self, key: str) -> frozenset[int]:
        return frozenset()

    def log_missing(self, points: Sequence[MetricPoint]) -> int:
        return 0

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def log_model(self, data_dir: Path, loader_module: str, name: str = "model") -> str | None:
        return None

    def log_adapter_model(
        self, model: Any, tokenizer: Any, task: str, base_path: str | None, name: str = "adapter"
    ) -> str | None:
        return None

    def log_table(self, table: pd.DataFrame, artifact_file: str) -> None:
        check_artifact_file(artifact_file, ".json")

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        check_artifact_file(artifact_file, ".png")

    def log_inputs(self, datasets: Sequence[DatasetLineage]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def finish(self, status: RunStatus = "FINISHED") -> None:
        self._active = False
