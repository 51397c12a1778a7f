"""Pinned sources: model.revision / task.revision reach the loaders, the commit loaded is recorded
(trajectory, tags) and replay loads it; the data's lineage goes to MLflow by public identifiers.

The tests run offline, so a hub id is served from a local copy: the real
loading code runs, and only transformers' ``from_pretrained`` (and ``datasets.load_dataset``)
are wrapped to record the revision they were given and to stamp the commit the Hub would
report, and ``huggingface_hub.model_info`` (asked first whether the hub answers) answers for
it. A revision that does not exist on a reachable hub cannot be tested offline.
"""

from __future__ import annotations

import importlib.machinery
import json
import re
import sys
import types
from pathlib import Path

import huggingface_hub
import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from privzo.config import ConfigError, ModelConfig, TaskConfig, load_config
from privzo.models.builtin import materialize_builtin
from privzo.models.loading import check_model, load_model
from privzo.replay import prepare_replay
from privzo.run import run
from privzo.tasks import data_lineage, load_splits, resolve_task_config
from privzo.tracking import DatasetLineage, open_client, read_run
from privzo.zo.trajectory import read_trajectory

HUB_ID = "some-org/tiny-opt"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_calls(monkeypatch, cache_dir) -> list[tuple[str, str | None]]:
    """Serve ``HUB_ID`` from the built-in tiny-opt; record (class, revision) of each load of it."""
    local = str(materialize_builtin("tiny-opt", cache_dir, progress=False))
    calls: list[tuple[str, str | None]] = []
    for cls in (AutoConfig, AutoModelForCausalLM, AutoTokenizer):
        real = cls.from_pretrained

        def served(source, *args, _real=real, _name=cls.__name__, **kwargs):
            if source != HUB_ID:
                return _real(source, *args, **kwargs)
            calls.append((_name, kwargs.pop("revision", None)))
            loaded = _real(local, *args, **kwargs)
            if _name == "AutoConfig":
                loaded._commit_hash = COMMIT  # what transformers sets from the Hub's answer
            return loaded

        monkeypatch.setattr(cls, "from_pretrained", served)
    real_info = huggingface_hub.model_info

    def info(repo_id, *args, _real=real_info, **kwargs):
        if repo_id != HUB_ID:
            return _real(repo_id, *args, **kwargs)
        return types.SimpleNamespace(id=HUB_ID, sha=COMMIT)  # the Hub's answer, in short

    monkeypatch.setattr(huggingface_hub, "model_info", info)
    return calls


def test_model_revision_reaches_every_load_and_is_recorded(hub_calls, cache_dir):
    loaded = load_model(ModelConfig(name_or_path=HUB_ID, revision="v1.0"), cache_dir, False)
    assert loaded.revision == COMMIT and loaded.source == HUB_ID
    assert sorted(hub_calls) == [
        ("AutoConfig", "v1.0"),
        ("AutoModelForCausalLM", "v1.0"),
        ("AutoTokenizer", "v1.0"),
    ]
    hub_calls.clear()
    unpinned = load_model(ModelConfig(name_or_path=HUB_ID), cache_dir, False)
    assert unpinned.revision == COMMIT  # the default branch's commit, recorded all the same
    assert {revision for _, revision in hub_calls} == {None}


def test_local_and_built_in_models_have_no_commit_and_refuse_a_revision(cache_dir):
    local = materialize_builtin("tiny-opt", cache_dir, progress=False)
    for name in ("tiny-opt", str(local)):
        assert load_model(ModelConfig(name_or_path=name), cache_dir, False).revision is None
        with pytest.raises(ConfigError, match=r"model\.revision='v1'.*hub id"):
            load_model(ModelConfig(name_or_path=name, revision="v1"), cache_dir, False)


def test_a_run_records_the_commit_and_replay_loads_it(
    hub_calls, tmp_path, sentiment_files, cache_dir
):
    train, test = sentiment_files
    config = load_config(
        None,
        [
            f"model.name_or_path={HUB_ID}",
            "model.revision=main",
            f"task.train_path={train}",
            f"task.test_path={test}",
            "optimizer.steps=4",
            "optimizer.batch_size=8",
            "tracking.log_every=2",
            "privacy.epsilon=3",
        ],
    )
    output = tmp_path / "runs" / "pinned"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert {revision for _, revision in hub_calls} == {"main"}
    _, meta = read_trajectory(output / "trajectory.parquet")
    assert meta.model_revision == COMMIT
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert record["tags"]["privzo.model_revision"] == COMMIT
    inputs = open_client(uri).get_run(summary["tracking_run_id"]).inputs.dataset_inputs
    logged = {
        item.tags[0].value: (item.dataset.source_type, json.loads(item.dataset.source))
        for item in inputs
    }
    assert logged == {
        "train": ("local", {"path": str(train)}),
        "test": ("local", {"path": str(test)}),
    }

    hub_calls.clear()
    setup = prepare_replay(HUB_ID, output / "trajectory.parquet", cache_dir=cache_dir)
    assert setup.loaded.revision == COMMIT
    assert {revision for _, revision in hub_calls} == {COMMIT}  # the commit, not "main"
    local = materialize_builtin("tiny-opt", cache_dir, progress=False)
    copy = prepare_replay(str(local), output / "trajectory.parquet", cache_dir=cache_dir)
    assert copy.loaded.revision is None  # a local copy loads as it is (fingerprint-checked)


@pytest.fixture
def hub_datasets(monkeypatch) -> list[dict]:
    """A stand-in ``datasets`` package (the ``hub`` extra is not installed here): records the
    arguments of each ``load_dataset`` call and answers with a few labelled rows."""
    calls: list[dict] = []
    rows = [{"sentence": f"review {i} was fine", "label": i % 2} for i in range(40)]

    def load_dataset(path, name=None, **kwargs):
        calls.append({"path": path, "name": name, **kwargs})
        return {"train": rows, "validation": rows[:10]}

    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_task_revision_reaches_load_dataset_and_the_lineage(hub_datasets):
    task = resolve_task_config(TaskConfig(name="sst2", revision="abc123", test_size=5), "causal")
    load_splits(task)
    assert hub_datasets == [{"path": "glue", "name": "sst2", "revision": "abc123"}]
    lineage = {item.context: item for item in data_lineage(task)}
    assert lineage["train"].source == {
        "path": "glue",
        "config_name": "sst2",
        "split": "train",
        "revision": "abc123",
    }
    assert lineage["test"].source["split"] == "validation" and lineage["train"].name == "glue/sst2"
    load_splits(resolve_task_config(TaskConfig(name="sst2", test_size=5), "causal"))
    assert "revision" not in hub_datasets[-1]


def test_task_revision_with_local_data_is_refused(sentiment_files):
    train, test = sentiment_files
    task = TaskConfig(train_path=str(train), test_path=str(test), revision="abc")
    with pytest.raises(ConfigError, match=r"task\.revision='abc'.*hub dataset"):
        load_splits(resolve_task_config(task, "causal"))


def test_lineage_digest_hashes_identifiers_only():
    """Same identifiers, same digest; the digest never depends on what the rows hold."""
    first = DatasetLineage("train.jsonl", "local", {"path": "/data/train.jsonl"}, "train")
    same = DatasetLineage("other-name", "local", {"path": "/data/train.jsonl"}, "test")
    moved = DatasetLineage("train.jsonl", "local", {"path": "/data/v2/train.jsonl"}, "train")
    assert first.digest == same.digest != moved.digest
    assert len(first.digest) == 16 and not Path("/data/train.jsonl").exists()


def test_weights_that_do_not_fit_the_config_architecture_are_refused(tmp_path, cache_dir):
    """A gpt2 config.json over OPT weights: every GPT-2 tensor would be newly initialised."""
    import shutil

    from transformers import GPT2Config

    local = materialize_builtin("tiny-opt", cache_dir, progress=False)
    mixed = shutil.copytree(local, tmp_path / "mixed")
    opt = AutoConfig.from_pretrained(local)
    GPT2Config(
        vocab_size=opt.vocab_size, n_embd=opt.hidden_size, n_layer=1, n_head=2
    ).save_pretrained(mixed)
    with pytest.raises(ConfigError, match=r"of the 'gpt2' architecture .* not in its weight"):
        load_model(ModelConfig(name_or_path=str(mixed)), cache_dir, False)
    assert load_model(ModelConfig(name_or_path=str(local)), cache_dir, False).kind == "causal"


@pytest.mark.parametrize("kept", [0, 100, -1], ids=["empty", "header-cut", "last-byte-cut"])
def test_a_cut_short_weight_file_is_refused_before_loading(tmp_path, cache_dir, kept):
    """A copy that stopped midway: privzo check and the run's loading name the file."""
    import os
    import shutil

    local = materialize_builtin("tiny-opt", cache_dir, progress=False)
    cut = shutil.copytree(local, tmp_path / "cut")
    weights = cut / "model.safetensors"
    os.truncate(weights, kept if kept >= 0 else weights.stat().st_size + kept)
    config = ModelConfig(name_or_path=str(cut))
    expected = re.escape(f"weight file '{weights}' is damaged or cut short")
    with pytest.raises(ConfigError, match=expected):
        check_model(config)
    with pytest.raises(ConfigError, match=expected):
        load_model(config, cache_dir, False)
    assert check_model(ModelConfig(name_or_path=str(local))) == "causal"
