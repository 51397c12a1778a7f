"""A run's fine-tuned model in MLflow: base reference + trajectory, rebuilt by replay on load."""

from __future__ import annotations

import mlflow
import mlflow.pyfunc
import pytest
import torch

from conftest import adapter_against_replay
from privzo.replay import replay
from privzo.run import run
from privzo.tracking import read_run

MODEL_RUN = ("optimizer.steps=6", "tracking.log_every=3")  # the tiny run, shorter


def test_a_run_logs_a_model_that_loads_by_replay(tmp_path, tiny_run_config, cache_dir):
    output = tmp_path / "runs" / "dp"
    summary = run(tiny_run_config(*MODEL_RUN), output, cache_dir=cache_dir, progress=False)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    model_uri = record["tags"]["privzo.model_uri"]
    assert model_uri == f"runs:/{summary['tracking_run_id']}/model"
    # kilobytes: the base's name and the trajectory, no weights
    logged = {path for path in record["artifacts"] if path.startswith("model/")}
    data = {"model/data/replay/base.json", "model/data/replay/trajectory.parquet"}
    assert {"model/MLmodel", *data} <= logged
    assert not any(path.endswith(".safetensors") for path in logged)
    assert "privzo.adapter_uri" not in record["tags"]  # full fine-tuning: no adapter

    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pyfunc.load_model(model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    rebuilt = loaded.get_raw_model()
    _base, expected, steps = replay(
        "tiny-opt", output / "trajectory.parquet", cache_dir=cache_dir, progress=False
    )
    assert steps == 6
    expected_weights = dict(expected.named_parameters())
    for name, parameter in rebuilt.named_parameters():
        assert torch.equal(parameter, expected_weights[name]), name
    losses = loaded.predict(["a nice film", "a bad film"])
    assert len(losses) == 2 and all(
        loss > 0 and torch.isfinite(torch.tensor(loss)) for loss in losses
    )


def test_a_run_without_tracking_logs_no_model(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(*MODEL_RUN, "tracking.backend=none")
    summary = run(config, tmp_path / "dp", cache_dir=cache_dir, progress=False)
    assert summary["tracking_run_id"] is None
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_first_order_run_logs_no_replayable_model(tmp_path, tiny_run_config, cache_dir):
    """First-order baselines keep no trajectory: their weights are saved instead, no model."""
    config = tiny_run_config(*MODEL_RUN, "optimizer.algorithm=dpsgd")
    summary = run(config, tmp_path / "runs" / "fo", cache_dir=cache_dir, progress=False)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert "privzo.model_uri" not in record["tags"]
    assert not any(path.startswith("model/") for path in record["artifacts"])


@pytest.mark.parametrize("view", ["lora", "prefix"])
def test_an_adapter_run_logs_its_adapter_as_a_transformers_model(
    tmp_path, tiny_run_config, cache_dir, view
):
    """LoRA / prefix: the peft adapter in MLflow's transformers flavor, the local base referenced
    by its path (no base weights logged); loaded back, it computes the replayed model's logits."""
    config = tiny_run_config(*MODEL_RUN, f"model.trainable={view}", "model.peft.lora_rank=2")
    output = tmp_path / "runs" / view
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    adapter_uri = record["tags"]["privzo.adapter_uri"]
    assert adapter_uri == f"runs:/{summary['tracking_run_id']}/adapter"
    logged = [path for path in record["artifacts"] if path.startswith("adapter/")]
    weights = [path for path in logged if path.endswith(".safetensors")]
    assert weights == ["adapter/peft/adapter_model.safetensors"], logged

    _parts, loaded, expected, steps = adapter_against_replay(
        uri, adapter_uri, output / "trajectory.parquet", cache_dir
    )
    assert steps == 6
    assert torch.equal(loaded, expected)
