"""Optional integrations: a command that needs a missing one is refused before it writes or
starts anything, naming the extra to install."""

from __future__ import annotations

import sys

import pytest

from privzo.cli import main
from privzo.extras import EXTRAS, MissingExtraError, require_extra


@pytest.fixture
def without(monkeypatch):
    """Make a package unimportable, as if it were not installed (None in sys.modules is what
    the import system treats as a blocked module)."""

    def block(package: str) -> None:
        for name in [name for name in sys.modules if name.split(".")[0] == package]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, package, None)

    return block


def test_installed_extras_pass_and_unknown_packages_are_a_programming_error():
    require_extra("optuna", "a search")  # installed with the test extra
    with pytest.raises(KeyError, match="not an optional dependency"):
        require_extra("peft", "a LoRA view")  # a core dependency: never checked at run time
    assert set(EXTRAS.values()) == {"hub", "optuna"}


def test_missing_extra_names_the_install_command(without):
    without("datasets")
    with pytest.raises(MissingExtraError, match=r"pip install 'privzo\[hub\]'"):
        require_extra("datasets", "hub dataset 'glue'")


def test_optuna_search_without_optuna_is_refused_before_anything_starts(
    without, make_search, tmp_path, capsys
):
    without("optuna")
    output = tmp_path / "search-out"
    code = main(
        [
            "tune",
            str(make_search(algorithm="optuna", trials={"count": 2})),
            "--output-dir",
            str(output),
        ]
    )
    assert code == 2
    assert "privzo[optuna]" in capsys.readouterr().err
    assert not output.exists()  # nothing written, and Ray was never started


def test_hub_task_without_datasets_is_refused_before_the_run_writes(
    without, tmp_path, cache_dir, capsys
):
    without("datasets")
    output = tmp_path / "run-out"
    config = tmp_path / "hub.yaml"
    config.write_text(
        "model: {name_or_path: tiny-opt}\n"
        "task: {name: sst2}\n"
        "optimizer: {algorithm: mezo, steps: 2, batch_size: 4}\n"
    )
    code = main(["run", str(config), "--output-dir", str(output), "--cache-dir", str(cache_dir)])
    assert code == 2
    assert "privzo[hub]" in capsys.readouterr().err
    assert not output.exists()
