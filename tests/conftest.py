"""Shared fixtures: a tiny labelled dataset on disk and a model cache for the session."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import yaml

from privzo.config import RunConfig, load_config

# The fused Triton kernels (privzo.zo.kernels) run on CPU tensors under Triton's interpreter,
# which Triton reads when a kernel is defined: privzo imports Triton only on first use, so
# setting it here, before any test runs, is early enough.
os.environ.setdefault("TRITON_INTERPRET", "1")

# The checkout's root, for tests that read its configs/, README.md or platform/ (tests sit at
# different depths under tests/, so none computes it from its own __file__).
REPO = Path(__file__).resolve().parents[1]

POSITIVE = ["good", "fine", "nice", "happy", "bright"]
NEGATIVE = ["bad", "poor", "sad", "dull", "awful"]


def write_sentiment_jsonl(path: Path, count: int, seed: int) -> Path:
    """Rows like {"sentence": "a nice film", "label": 1}, balanced, deterministic by seed."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for index in range(count):
            label = index % 2
            word = rng.choice(POSITIVE if label else NEGATIVE)
            handle.write(json.dumps({"sentence": f"a {word} film", "label": label}) + "\n")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("privzo-cache")


@pytest.fixture
def sentiment_files(tmp_path) -> tuple[Path, Path]:
    return (
        write_sentiment_jsonl(tmp_path / "train.jsonl", 64, seed=1),
        write_sentiment_jsonl(tmp_path / "test.jsonl", 20, seed=2),
    )


# The tiny run the run-level tests share: 12 DPZero steps of tiny-opt on ``sentiment_files``,
# 8 rows a batch, learning rate 1e-3, ε = 3, metrics every 5 steps.
TINY_RUN = (
    "optimizer.steps=12",
    "optimizer.batch_size=8",
    "optimizer.learning_rate=1e-3",
    "tracking.log_every=5",
    "privacy.epsilon=3",
)


@pytest.fixture
def tiny_run_config(sentiment_files):
    """``tiny_run_config(*overrides)``: the tiny run's config, ``key=value`` overrides applied
    after ``TINY_RUN`` (so a later value of the same key wins)."""
    train, test = sentiment_files

    def build(*overrides: str) -> RunConfig:
        paths = [f"task.train_path={train}", f"task.test_path={test}"]
        return load_config(None, ["model.name_or_path=tiny-opt", *paths, *TINY_RUN, *overrides])

    return build


@pytest.fixture
def make_search(tmp_path, sentiment_files):
    """Writes a tiny private search (base run + 2 × 2 grid over clip and steps); keyword
    arguments replace top-level keys of the search config."""

    def write(**search) -> Path:
        train, test = sentiment_files
        base = {
            "model": {"name_or_path": "tiny-opt"},
            "task": {"train_path": str(train), "test_path": str(test), "validation_size": 16},
            "optimizer": {"algorithm": "dpzero", "steps": 10, "batch_size": 8},
            "privacy": {"epsilon": 2.0, "delta": 1e-5},
            "tracking": {"experiment": "search-test", "log_every": 5},
        }
        (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
        data = {
            "base": "base.yaml",
            "space": {"privacy.clip": [0.5, 1.0], "optimizer.steps": [10, 30]},
            "algorithm": "grid",
            **search,
        }
        path = tmp_path / "search.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write
