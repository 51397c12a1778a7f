"""Where a task's rows come from (a built-in dataset, a data directory, local files or the hub),
reading them, and naming that source by public identifiers only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from privzo.config.tasks import TaskConfig
from privzo.section import ConfigError
from privzo.tasks.data import SUFFIXES, Row, load_hf_rows, read_rows
from privzo.tasks.presets import HubSource, get_preset
from privzo.tracking import DatasetLineage

__all__ = ["BUILTIN_DATASETS", "check_revision", "data_lineage", "describe_source", "read_pools"]


def _demo_sentiment() -> tuple[list[Row], list[Row]]:
    """The embedded demo's private task: 2000 synthetic reviews to train on, 1000 to test."""
    from privzo.demo_data import private_sentiment_task

    return private_sentiment_task(num_train=2000, num_test=1000, seed=0)


BUILTIN_DATASETS = {"demo-sentiment": _demo_sentiment}


def read_pools(config: TaskConfig) -> tuple[list[Row], list[Row] | None]:
    """(training pool, test pool or None to hold one out) from the configured source."""
    if config.builtin_dataset is not None:
        if config.builtin_dataset not in BUILTIN_DATASETS:
            raise ConfigError(
                f"task.builtin_dataset={config.builtin_dataset!r} is unknown; allowed: "
                f"{sorted(BUILTIN_DATASETS)}"
            )
        return BUILTIN_DATASETS[config.builtin_dataset]()
    if config.data_dir is not None:
        return _read_data_dir(Path(config.data_dir).expanduser())
    if config.train_path is not None:
        train = read_rows(config.train_path, "task.train_path")
        test = read_rows(config.test_path, "task.test_path") if config.test_path else None
        return train, test
    source = _hub_source(config)
    if source is None:
        raise ConfigError(
            "task: set task.data_dir, task.train_path (local files), task.hf_dataset or "
            "task.builtin_dataset (a preset task falls back to its hub dataset)"
        )
    return load_hf_rows(source)


def _read_data_dir(directory: Path) -> tuple[list[Row], list[Row]]:
    if not directory.is_dir():
        raise ConfigError(f"task.data_dir={str(directory)!r}: directory does not exist")
    splits = []
    for split in ("train", "test"):
        found = [directory / f"{split}{suffix}" for suffix in SUFFIXES]
        existing = [path for path in found if path.is_file()]
        if not existing:
            raise ConfigError(
                f"task.data_dir={str(directory)!r} has no {split} file; expected one of "
                f"{[path.name for path in found]}"
            )
        splits.append(read_rows(existing[0], "task.data_dir"))
    return splits[0], splits[1]


def _hub_source(config: TaskConfig) -> HubSource | None:
    if config.hf_dataset is not None:
        return HubSource(config.hf_dataset, config.hf_subset, revision=config.revision)
    preset = get_preset(config.name)
    if preset is None or preset.source is None:
        return None
    return dataclasses.replace(preset.source, revision=config.revision)


def _local_source(config: TaskConfig) -> bool:
    """The rows come from privzo or local files, not from the hub."""
    return any(
        value is not None for value in (config.builtin_dataset, config.data_dir, config.train_path)
    )


def check_revision(config: TaskConfig) -> None:
    """``task.revision`` pins a hub dataset; with local or built-in data it would pin nothing."""
    if config.revision is not None and (_local_source(config) or _hub_source(config) is None):
        raise ConfigError(
            f"task.revision={config.revision!r}: a revision pins a hub dataset (task.hf_dataset "
            "or a preset's hub source), but this task reads built-in or local data; unset it"
        )


def data_lineage(config: TaskConfig) -> list[DatasetLineage]:
    """Where the run's rows came from, by public identifiers only (hub id, subset, split,
    revision, or a file path): never a digest or profile of the rows themselves."""
    if config.builtin_dataset is not None:
        source = {"builtin_dataset": config.builtin_dataset}
        return [DatasetLineage(config.builtin_dataset, "privzo", source, "train")]
    if _local_source(config):
        files = {"train": config.data_dir or config.train_path, "test": config.test_path}
        return [
            DatasetLineage(Path(path).name, "local", {"path": str(path)}, context)
            for context, path in files.items()
            if path is not None
        ]
    hub = _hub_source(config)
    if hub is None:
        return []
    name = hub.dataset if hub.subset is None else f"{hub.dataset}/{hub.subset}"
    return [
        DatasetLineage(
            name,
            "hugging_face",
            {
                "path": hub.dataset,
                "config_name": hub.subset,
                "split": split,
                "revision": hub.revision,
            },
            context,
        )
        for context, split in (("train", hub.train_split), ("test", hub.test_split))
    ]


def describe_source(config: TaskConfig) -> str:
    """Where the rows come from, in the config's own terms (for ``privzo check`` and a run's
    first lines): the key that chose the source and what it names, and where the test rows are."""
    if config.builtin_dataset is not None:
        return f"task.builtin_dataset={config.builtin_dataset!r} (built into privzo; its test rows)"
    if config.data_dir is not None:
        return f"task.data_dir={config.data_dir!r} (its train and test files)"
    if config.train_path is not None:
        test = (
            f"test rows from task.test_path={config.test_path!r}"
            if config.test_path is not None
            else "test rows held out of it"
        )
        return f"task.train_path={config.train_path!r} ({test})"
    hub = _hub_source(config)
    if hub is None:
        return "no source"
    name = hub.dataset if hub.subset is None else f"{hub.dataset}/{hub.subset}"
    origin = "task.hf_dataset" if config.hf_dataset is not None else f"the {config.name} preset"
    return f"hub dataset {name!r} from {origin} (splits {hub.train_split!r} and {hub.test_split!r})"
