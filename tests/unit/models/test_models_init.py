"""`privzo models init`: a random OPT-shaped directory that `privzo run` loads like a checkpoint."""

from __future__ import annotations

import json

import pytest
import yaml
from transformers import AutoTokenizer

from privzo.cli import main
from privzo.models.architecture import count_parameters
from privzo.models.random_init import init_model_directory
from privzo.models.shapes import SHAPES, random_model


def test_init_then_run_on_it(tmp_path, capsys):
    model_dir = tmp_path / "tiny-model"
    assert main(["models", "init", "--shape", "tiny", "--output-dir", str(model_dir)]) == 0
    assert "model.name_or_path=" in capsys.readouterr().out
    record = json.loads((model_dir / "privzo_init.json").read_text())
    assert record["parameters"] == count_parameters(SHAPES["tiny"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert len(tokenizer) == rows == SHAPES["tiny"].vocab
    ids = tokenizer("Zürich, 42 rooms 😀 . It was")["input_ids"]
    assert (
        tokenizer.unk_token_id not in ids
        and tokenizer.decode([rows - 1]) == f"<reserved_{rows - 1}>"
    )
    config = {
        "model": {"name_or_path": str(model_dir)},
        "task": {
            "builtin_dataset": "demo-sentiment",
            "template": "{sentence} It was",
            "label_words": ["terrible", "great"],
            "train_size": 64,
            "test_size": 16,
        },
        "optimizer": {"algorithm": "mezo", "steps": 3, "batch_size": 4},
        "privacy": {"sampler": "shuffle"},
        "tracking": {"backend": "none"},
        "eval_before": False,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    output = tmp_path / "run"
    argv = ["run", str(tmp_path / "run.yaml"), "--output-dir", str(output), "--quiet"]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == 3 and 0.0 <= summary["accuracy_after"] <= 1.0


def test_init_refuses_a_non_empty_directory_before_building(tmp_path):
    (tmp_path / "kept.txt").write_text("x")
    with pytest.raises(ValueError, match="not an empty directory"):
        init_model_directory("tiny", tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["kept.txt"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--shape", "opt-3b"], "unknown shape 'opt-3b'"),
        (["--shape", "tiny", "--dtype", "int8"], "unknown dtype 'int8'"),
    ],
)
def test_init_refuses_unknown_shapes_and_dtypes(tmp_path, capsys, arguments, message):
    assert main(["models", "init", *arguments, "--output-dir", str(tmp_path / "m")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "shape",
    [
        "opt-125m",
        "opt-350m",
        "llama-3.1-8b",
        "qwen2.5-0.5b",
        "qwen2.5-7b",
        "mistral-7b",
        "tiny-llama",
        "tiny-qwen2",
    ],
)
def test_shapes_build_with_the_planners_parameter_count(shape):
    """The registry's configs give the models the planner counts (350m: projections, no final
    norm; Llama and Mistral: untied heads, grouped key/value heads; Qwen2: query/key/value
    biases, the 0.5B's tied head), built on the meta device so no memory is spent."""
    model = random_model(SHAPES[shape], device="meta")
    assert sum(p.numel() for p in model.parameters()) == count_parameters(SHAPES[shape])
