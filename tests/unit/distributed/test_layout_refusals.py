"""Distributed layouts' bad input: a clear error before Ray or any worker starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, SMALL_RUN
from privzo.config import ConfigError, load_config
from privzo.preflight import memory_plan, preflight
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


# a named shape by hub id: the planner knows it without weights, and nothing is downloaded
OPT_66B = ["model.name_or_path=facebook/opt-66b", "model.kind=causal", "model.dtype=float16"]


def _offload(kind: str, *extra: str) -> list[str]:
    return [*_layout("zero3", 1), f"parallel.offload={kind}", *extra]


@pytest.mark.parametrize("strategy", ["single", "replica"])
def test_offload_needs_zero3(strategy):
    with pytest.raises(ConfigError, match=rf"parallel.offload='cpu' with .*'{strategy}'.*'zero3'"):
        _config(TINY_MEZO, f"parallel.strategy={strategy}", "parallel.offload=cpu")


def test_nvme_offload_needs_a_folder():
    with pytest.raises(ConfigError, match=r"offload='nvme' without parallel.nvme_path"):
        _config(TINY_MEZO, *_offload("nvme"))


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder nothing can be written in: its mode where it binds, a proc folder for root
    (which file modes do not stop)."""
    if os.geteuid() == 0:
        return Path("/proc/self")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    return folder


@pytest.mark.parametrize("problem", ["missing", "read-only"])
def test_nvme_folder_must_exist_and_be_writable(tmp_path, cache_dir, problem):
    folder = tmp_path / "absent" if problem == "missing" else _read_only_folder(tmp_path)
    config = _config(TINY_MEZO, *_offload("nvme", f"parallel.nvme_path={folder}"))
    message = "is not an existing folder" if problem == "missing" else "is not writable"
    with pytest.raises(ConfigError, match=rf"parallel.nvme_path='{folder}' {message}"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


def test_host_memory_below_the_plan_is_refused(tmp_path, cache_dir):
    config = _config(TINY_MEZO, *OPT_66B, *_offload("cpu", "parallel.host_memory_gb=64"))
    verdict = memory_plan(config, None)
    assert verdict is not None and verdict.host_fits is False
    need = f"{verdict.host_bytes / 2**30:.1f}"
    with pytest.raises(ConfigError, match=rf"offload='cpu'.* needs about {need} GiB of host"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()
    accepted = _config(TINY_MEZO, *OPT_66B, *_offload("cpu", "parallel.host_memory_gb=1024"))
    memory = preflight(accepted).memory
    assert memory is not None and memory.host_fits  # the same plan on a host that holds it


def test_nvme_folder_smaller_than_the_plan_is_refused(tmp_path, cache_dir):
    """The partitions' files against the folder's free space: OPT-125M's fit in any test
    machine's temporary folder, OPT-66B's in float32 (245 GiB) in hardly any. A folder that
    holds them meets the refusal of NVMe partitions, which the trainer does not run yet."""
    free = shutil.disk_usage(tmp_path).free
    nvme = _offload("nvme", f"parallel.nvme_path={tmp_path}")
    small = _config(TINY_MEZO, "model.name_or_path=facebook/opt-125m", "model.kind=causal", *nvme)
    large = _config(TINY_MEZO, *OPT_66B, "model.dtype=float32", *nvme)
    small_plan, large_plan = memory_plan(small, None), memory_plan(large, None)
    assert small_plan is not None and large_plan is not None
    assert small_plan.nvme_bytes < free
    with pytest.raises(ConfigError, match=r"offload='nvme': .* do not swap them .* 'cpu'"):
        preflight(small)  # the folder passes; the trainer cannot run NVMe partitions
    need = large_plan.nvme_bytes
    if need <= free:
        pytest.skip(f"{free / 2**30:.0f} GiB free in the temporary folder holds OPT-66B")
    take = rf"has [\d.]+ GiB free; the partitions .* take {need / 2**30:.1f} GiB"
    with pytest.raises(ConfigError, match=take):
        _run(large, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()
