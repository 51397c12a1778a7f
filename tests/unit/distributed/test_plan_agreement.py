"""The planner and the runner agree: a GPU layout passes the run's validation (``privzo check``
and ``privzo run`` make the same checks before any worker starts) exactly where ``privzo plan``
calls it fitting, over the planner's whole table of shapes, in every dtype, with the partitions
on the GPUs or offloaded to host memory."""

from __future__ import annotations

import itertools

import pytest

from conftest import REPO, write_sentiment_jsonl
from privzo.cli import main
from privzo.config import ConfigError
from privzo.config.loading import apply_overrides, build_config, read_yaml
from privzo.distributed.checks import check_layout, check_verdict
from privzo.models.shapes import FAMILY_SHAPES, HUB_IDS, OPT_SHAPES
from privzo.planner import SEQ_LEN, plan
from privzo.preflight import memory_plan

BASE = REPO / "configs" / "runs" / "opt-66b-dpzero-zero3-fp16.yaml"
HUB_ID = {name: hub for hub, name in HUB_IDS.items()}  # one hub id per named shape
PER_GPU_BATCH = 16  # the planner's default batch


def _accepted(config) -> bool:
    """Whether the run's validation of the layout passes (``privzo.preflight``'s checks)."""
    try:
        check_layout(config)
        memory = memory_plan(config, None)  # the share privzo plan is asked for, unpadded
        assert memory is not None, config.model.name_or_path  # a named shape's hub id
        check_verdict(config, memory)
    except ConfigError:
        return False
    return True


def _layout(
    base: dict, name: str, dtype: str, gpus: int, memory_gb: float, strategy: str, *extra: str
):
    overrides = [
        f"model.name_or_path={HUB_ID[name]}",
        f"model.dtype={dtype}",
        f"parallel.strategy={strategy}",
        f"parallel.workers={gpus}",
        f"parallel.gpu_memory_gb={memory_gb}",
        f"optimizer.batch_size={PER_GPU_BATCH * gpus}",
        f"task.max_length={SEQ_LEN}",  # the planner's default length, not the config's
        *extra,
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


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_runner_accepts_what_the_planner_calls_fitting_offloaded(dtype):
    """Offloaded to host memory: zero3 whatever fits, judged on the GPUs and on the host."""
    base = read_yaml(BASE)
    table = list(
        itertools.product([*OPT_SHAPES, *FAMILY_SHAPES], (1, 8), (24.0, 80.0), (64.0, 1024.0))
    )
    for name, gpus, memory_gb, host_gb in table:
        verdict = plan(
            name, gpus=gpus, gpu_memory_gb=memory_gb, dtype=dtype, offload="cpu",
            host_memory_gb=host_gb,
        )  # fmt: skip
        assert verdict.strategy == "zero3" and verdict.host_fits is not None
        offload = ["parallel.offload=cpu", f"parallel.host_memory_gb={host_gb}"]
        config = _layout(base, name, dtype, gpus, memory_gb, "zero3", *offload)
        assert _accepted(config) == verdict.fits, (name, gpus, memory_gb, host_gb)
    verdicts = [
        plan(n, gpus=g, gpu_memory_gb=m, dtype=dtype, offload="cpu", host_memory_gb=h)
        for n, g, m, h in table
    ]
    assert any(v.fits for v in verdicts) and not all(v.host_fits for v in verdicts)
    # GPUs that cannot hold the shards hold the offloaded layers
    unsharded = [plan(n, gpus=g, gpu_memory_gb=m, dtype=dtype).fits for n, g, m, _ in table]
    assert any(v.fits and not fits for v, fits in zip(verdicts, unsharded, strict=True))


def test_check_accepts_the_shipped_offload_config(tmp_path, capsys):
    """OPT-66B in fp16 on one 80 GiB GPU, offloaded to a 256 GiB host: the plan the config's
    comment quotes, through ``privzo check``, for the forward DPZero runs (its batch padded to
    the privacy plan's 51 rows of the config's 128 tokens); the same config on a host below the
    plan refused."""
    for split, count in (("train", 2000), ("test", 1000)):
        write_sentiment_jsonl(tmp_path / f"{split}.jsonl", count, seed=len(split))
    config = REPO / "configs" / "runs" / "opt-66b-dpzero-zero3-offload.yaml"
    args = ["check", str(config), f"task.data_dir={tmp_path}", "tracking.backend=none"]
    code = main(args)
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "51 rows × 128 tokens, 51 rows per forward" in printed
    verdict = plan(
        "opt-66b", gpus=1, gpu_memory_gb=80, dtype="float16", batch_size=51, seq_len=128,
        offload="cpu", host_memory_gb=256,
    )  # fmt: skip
    assert verdict.fits and verdict.host_fits
    gib = 2**30
    assert f"zero3 on 1 GPU(s) of 80 GiB: {verdict.bytes_per_gpu / gib:.2f} GiB per GPU" in printed
    assert f"offload cpu: {verdict.host_bytes / gib:.1f} GiB of the host's 256.0 GiB" in printed
    assert main([*args, "parallel.host_memory_gb=128"]) != 0
    assert "needs about 126.4 GiB of host memory" in capsys.readouterr().err


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
