"""A scaling study over a mixed list of decoder families runs its models from the fewest
parameters up, counted from their named shapes without weights."""

from __future__ import annotations

from conftest import REPO
from privzo.studies.cells import expand_cells, models_by_size
from privzo.studies.config import load_study_config


def test_a_mixed_list_of_families_is_ordered_by_parameters():
    models = ["facebook/opt-13b", "meta-llama/Llama-3.1-8B", "qwen2.5-0.5b", "mistral-7b"]
    assert models_by_size(models) == [
        "qwen2.5-0.5b",
        "mistral-7b",
        "meta-llama/Llama-3.1-8B",
        "facebook/opt-13b",
    ]


def test_a_model_of_unknown_shape_keeps_the_order_given():
    assert models_by_size(["tiny-opt", "facebook/opt-125m"]) == ["tiny-opt", "facebook/opt-125m"]


def test_the_shipped_mixed_study_runs_opt_and_llama_by_size():
    study = load_study_config(REPO / "configs" / "studies" / "dpzero-opt-llama.yaml")
    order = list(dict.fromkeys(cell.model for cell in expand_cells(study)))
    assert order == [
        "facebook/opt-1.3b",
        "facebook/opt-6.7b",
        "meta-llama/Llama-3.1-8B",
        "facebook/opt-13b",
    ]
