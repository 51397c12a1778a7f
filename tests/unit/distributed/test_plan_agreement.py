"""The planner and the runner agree: a GPU layout passes the run's validation (``privzo check``
and ``privzo run`` make the same checks before any worker starts) exactly where ``privzo plan``
calls it fitting, over the planner's whole table of shapes, in every dtype."""

from __future__ import annotations

import itertools

import pytest

from conftest import REPO, write_sentiment_jsonl
from privzo.cli import main
from privzo.config import ConfigError
from privzo.config.loading import apply_overrides, build_config, read_yaml
from privzo.distributed.launch import check_layout, check_verdict
from privzo.models.shapes import FAMILY_SHAPES, HUB_IDS, OPT_SHAPES
from privzo.planner import plan
from privzo.preflight import memory_plan

BASE = REPO / "configs" / "runs" / "opt-66b-dpzero-zero3.yaml"
HUB_ID = {name: hub for hub, name in HUB_IDS.items()}  # one hub id per named shape
PER_GPU_BATCH = 16  # the planner's default batch


def _accepted(config) -> bool:
    """Whether the run's validation of the layout passes (``privzo.preflight``'s checks)."""
    try:
        check_layout(config)
        memory = memory_plan(config)
        assert memory is not None, config.model.name_or_path  # a named shape's hub id
        check_verdict(config, memory)
    except ConfigError:
        return False
    return True


def _layout(base: dict, name: str, dtype: str, gpus: int, memory_gb: float, strategy: str):
    overrides = [
        f"model.name_or_path={HUB_ID[name]}",
        f"model.dtype={dtype}",
        f"parallel.strategy={strategy}",
        f"parallel.workers={gpus}",
        f"parallel.gpu_memory_gb={memory_gb}",
        f"optimizer.batch_size={PER_GPU_BATCH * gpus}",
    ]
    return build_config(apply_overrides(base, overrides))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_runner_accepts_what_the_planner_calls_fitting(dtype):
    base = read_yaml(BASE)
    table = list(
        itertools.product([*OPT_SHAPES, *FAMILY_SHAPES], (1, 2, 4, 8), (24.0, 80.0, 141.0))
    )
    for name, gpus, memory_gb in table:
        verdict = plan(name, gpus=gpus, gpu_memory_gb=memory_gb, dtype=dtype)
        for strategy in ("replica", "zero3"):
            config = _layout(base, name, dtype, gpus, memory_gb, strategy)
            # zero3 holds less than a replica, so it fits wherever a replica does
            planned = verdict.fits and (strategy == "zero3" or verdict.strategy == strategy)
            assert _accepted(config) == planned, (name, gpus, memory_gb, strategy)
    fitting = [plan(n, gpus=g, gpu_memory_gb=m, dtype=dtype).fits for n, g, m in table]
    assert any(fitting) and not all(fitting)  # the table holds both verdicts


def test_check_accepts_the_shipped_half_precision_zero3_config(tmp_path, capsys):
    """OPT-66B in fp16 on 2 × 80 GiB: the plan the config's comment quotes, through
    ``privzo check`` (the cluster's data directory stood in for by rows of the same shape)."""
    for split, count in (("train", 2000), ("test", 1000)):
        write_sentiment_jsonl(tmp_path / f"{split}.jsonl", count, seed=len(split))
    config = REPO / "configs" / "runs" / "opt-66b-dpzero-zero3-fp16.yaml"
    code = main(["check", str(config), f"task.data_dir={tmp_path}", "tracking.backend=none"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    verdict = plan("opt-66b", gpus=2, gpu_memory_gb=80, dtype="float16")
    assert verdict.strategy == "zero3" and verdict.fits
    assert f"{verdict.parameters:,} parameters; zero3 on 2 GPU(s) of 80 GiB" in printed
