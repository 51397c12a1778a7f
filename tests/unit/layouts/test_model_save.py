"""A run's saved model (first-order runs, ``save_model=true``) is whole or absent: a save the
file system refuses (a full disk) leaves no part of it and ends in one line naming the folder."""

from __future__ import annotations

import resource
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from privzo.layouts.layout import get_layout
from privzo.models import builtin


@pytest.fixture(scope="module")
def context(cache_dir: Path) -> SimpleNamespace:
    """The two things a layout saves from a run's context: the real tiny model and tokenizer."""
    path = builtin.materialize_builtin("tiny-opt", cache_dir, progress=False)
    model = AutoModelForCausalLM.from_pretrained(path)
    return SimpleNamespace(
        model=model, loaded=SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(path))
    )


def test_a_saved_model_replaces_an_earlier_attempts(tmp_path: Path, context) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "stale.bin").write_bytes(b"from a killed attempt")
    get_layout("single").save_whole_model(context, 0, directory)
    assert (directory / "model.safetensors").is_file() and (directory / "config.json").is_file()
    assert not (directory / "stale.bin").exists()
    assert [entry.name for entry in tmp_path.iterdir()] == ["model"]


def test_a_save_the_file_system_refuses_leaves_no_part_of_the_model(tmp_path: Path, context):
    """A file size limit fails the weights' write as a full disk does (safetensors raises its
    own error type for it)."""
    directory = tmp_path / "model"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
        with pytest.raises(OSError) as failed:
            get_layout("single").save_whole_model(context, 0, directory)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    message = str(failed.value)
    assert message.startswith(f"cannot save the model to {directory} ("), message
    assert message.endswith("then run the same command again") and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # neither the model nor its partial folder
