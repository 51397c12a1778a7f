"""The fit check before workers start: every decoder family the planner models is checked, and
a model of another family is refused on GPUs, since its fit cannot be checked."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, GPT2Config

from conftest import REPO
from privzo.config import ConfigError, load_config
from privzo.distributed.checks import check_fit, config_plan
from privzo.models.architecture import arch_from_config, hf_config
from privzo.models.loading import resolve_source
from privzo.models.shapes import SHAPES
from privzo.planner import SAFETY_MARGIN
from privzo.preflight import preflight
from privzo.run.training import OnRayTrain


def _gpu_config(*extra: str):
    layout = ["parallel.strategy=replica", "parallel.workers=2", "parallel.use_gpu=true"]
    return load_config(REPO / "configs" / "runs" / "tiny-mezo.yaml", [*layout, *extra])


def test_a_llama_that_does_not_fit_is_refused(tmp_path):
    hf_config(SHAPES["llama-3.1-70b"]).save_pretrained(tmp_path)  # config.json, no weights
    with pytest.raises(ConfigError, match=r"does not fit whole in one 80 GiB GPU"):
        check_fit(_gpu_config(), str(tmp_path), None)
    check_fit(_gpu_config("parallel.strategy=zero3", "parallel.workers=8"), str(tmp_path), None)


def test_an_unmodelled_family_is_refused_naming_the_known_ones(tmp_path):
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"'gpt2' is not a decoder family.*known families: opt"):
        check_fit(_gpu_config(), str(tmp_path), None)


def test_a_built_in_models_fit_is_planned_at_the_rows_workers_pad_to(
    tmp_path, cache_dir, tiny_run_config
):
    """DPZero workers pad their share of every batch to the privacy plan's bound: on a GPU that
    holds one forward of the share but not of the bound, the fit check before workers start
    refuses the run (a built-in model, which only this check plans)."""
    gpu = ["parallel.strategy=replica", "parallel.workers=2", "parallel.use_gpu=true"]
    config = tiny_run_config(*gpu, "model.device=auto")  # the tiny run's calibration, cached
    rows = preflight(config).privacy.max_batch_size
    assert rows is not None and rows > config.optimizer.batch_size // 2
    source = resolve_source(config.model, cache_dir, progress=False)
    arch = arch_from_config(AutoConfig.from_pretrained(source))
    share, padded = config_plan(config, arch, None), config_plan(config, arch, rows)
    between = (share.bytes_per_gpu + padded.bytes_per_gpu) / 2 / (1 - SAFETY_MARGIN) / 2**30
    narrow = config.model_copy(
        update={"parallel": config.parallel.model_copy(update={"gpu_memory_gb": between})}
    )
    check_fit(narrow, source, None)  # one forward of the share fits
    with pytest.raises(ConfigError, match=r"does not fit whole in one [\d.]+ GiB GPU"):
        OnRayTrain(narrow, preflight(narrow), tmp_path, cache_dir, False, None, (None, None), None)
