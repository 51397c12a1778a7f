"""The fit check before workers start: every decoder family the planner models is checked, and
a model of another family is refused on GPUs, since its fit cannot be checked."""

from __future__ import annotations

import pytest
from transformers import GPT2Config

from conftest import REPO
from privzo.config import ConfigError, load_config
from privzo.distributed.checks import check_fit
from privzo.models.architecture import hf_config
from privzo.models.shapes import SHAPES


def _gpu_config(*extra: str):
    layout = ["parallel.strategy=replica", "parallel.workers=2", "parallel.use_gpu=true"]
    return load_config(REPO / "configs" / "runs" / "tiny-mezo.yaml", [*layout, *extra])


def test_a_llama_that_does_not_fit_is_refused(tmp_path):
    hf_config(SHAPES["llama-3.1-70b"]).save_pretrained(tmp_path)  # config.json, no weights
    with pytest.raises(ConfigError, match=r"does not fit whole in one 80 GiB GPU"):
        check_fit(_gpu_config(), str(tmp_path))
    check_fit(_gpu_config("parallel.strategy=zero3", "parallel.workers=8"), str(tmp_path))


def test_an_unmodelled_family_is_refused_naming_the_known_ones(tmp_path):
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"'gpt2' is not a decoder family.*known families: opt"):
        check_fit(_gpu_config(), str(tmp_path))
