"""Distributed layouts' bad input: a clear error before Ray or any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, SMALL_RUN
from privzo.config import ConfigError, load_config
from privzo.run import RunHooks, run

TINY_MEZO = REPO / "configs" / "runs" / "tiny-mezo.yaml"


def _config(path: Path, *extra: str):
    return load_config(path, [*SMALL_RUN, *extra])


def _layout(strategy: str, workers: int) -> list[str]:
    return [f"parallel.strategy={strategy}", f"parallel.workers={workers}"]


def _run(config, output: Path, cache_dir: Path):
    return run(config, output, cache_dir=cache_dir, progress=False)


def test_canaries_are_refused_on_a_distributed_layout(tmp_path, cache_dir):
    """An audit's ``training_rows`` needs the rows in this process: refused before Ray starts."""
    config = _config(TINY_MEZO, *_layout("replica", 2))
    hooks = RunHooks(training_rows=lambda task_config, rows: rows)
    with pytest.raises(ConfigError, match="an audit's canaries need the training rows"):
        run(config, tmp_path / "out", cache_dir=cache_dir, progress=False, hooks=hooks)
    assert not (tmp_path / "out").exists()


def test_expected_batch_smaller_than_workers_is_refused(tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("replica", 2), "optimizer.batch_size=1")
    with pytest.raises(ConfigError, match=r"batch_size=1 .* parallel.workers=2"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


def test_zero3_needs_the_full_view(tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("zero3", 2), "model.trainable=lora")
    with pytest.raises(ConfigError, match=r"model.trainable='lora' with parallel.strategy='zero3'"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


def test_single_strategy_takes_one_worker():
    with pytest.raises(ConfigError, match=r"parallel.workers=2 with parallel.strategy='single'"):
        _config(TINY_MEZO, "parallel.workers=2")


def test_planner_refuses_a_model_that_does_not_fit(tmp_path, cache_dir):
    config = _config(
        TINY_MEZO,
        *_layout("replica", 2),
        "parallel.use_gpu=true",
        "model.device=auto",
        "parallel.gpu_memory_gb=0.01",
    )
    with pytest.raises(ConfigError, match=r"does not fit whole in one 0.01 GiB GPU"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()
