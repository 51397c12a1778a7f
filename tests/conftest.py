"""Shared fixtures: a tiny labelled dataset on disk and a model cache for the session."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

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
