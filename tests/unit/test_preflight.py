"""Preflight: every algorithm × layout × mechanism either passes it (and, in one process, runs
two steps on the tiny model) or is refused by it with a clear error, nothing written."""

from __future__ import annotations

import itertools
import re
from typing import get_args

import pytest

from conftest import REPO, write_sentiment_jsonl
from privzo.cli import main
from privzo.config import ALGORITHMS, ConfigError, LayoutName, MechanismName, load_config
from privzo.preflight import preflight
from privzo.run import run

MECHANISMS = [None, *get_args(MechanismName)]
LAYOUTS = list(get_args(LayoutName))
PRIVATE = {"dpzero", "dpzo-laplace", "dpsgd", "dpgd-0th"}  # the spec, written out
VECTOR_NOISE = {"dpsgd", "dpgd-0th"}  # d-dimensional Gaussian noise only
SINGLE_ONLY = {"dpsgd", "adamw", "dpgd-0th"}  # no all-reducing scalar estimator


def _refusal(algorithm: str, layout: str, mechanism: str | None) -> str | None:
    """The field a correct preflight names when it refuses this combination, else None."""
    if mechanism is not None and algorithm not in PRIVATE:
        return "privacy.mechanism"
    if mechanism in ("laplace", "lmo") and algorithm in VECTOR_NOISE:
        return "privacy.mechanism"
    if layout != "single" and algorithm in SINGLE_ONLY:
        return "parallel.strategy"
    return None


def _overrides(algorithm: str, layout: str, mechanism: str | None) -> list[str]:
    """The tiny run (``tiny_run_config``), 2 steps of ``algorithm`` on ``layout``."""
    overrides = [
        f"optimizer.algorithm={algorithm}",
        "optimizer.steps=2",
        "tracking.log_every=1",
        "tracking.backend=none",
        "eval_before=false",
        f"parallel.strategy={layout}",
    ]
    if layout != "single":
        overrides.append("parallel.workers=2")
    if mechanism is not None:
        overrides.append(f"privacy.mechanism={mechanism}")
    if mechanism == "lmo":
        overrides.append("privacy.accountant=numeric")  # the one that accounts lmo (gridded)
    return overrides


COMBINATIONS = list(itertools.product(ALGORITHMS, LAYOUTS, MECHANISMS))


@pytest.mark.parametrize(
    ("algorithm", "layout", "mechanism"),
    COMBINATIONS,
    ids=[f"{a}-{lay}-{m or 'default'}" for a, lay, m in COMBINATIONS],
)
def test_each_combination_runs_or_is_refused_before_anything(
    tmp_path, tiny_run_config, cache_dir, algorithm, layout, mechanism
):
    config = tiny_run_config(*_overrides(algorithm, layout, mechanism))
    output = tmp_path / "run"
    field = _refusal(algorithm, layout, mechanism)
    if field is not None:
        with pytest.raises(ConfigError) as refused:
            preflight(config, output_dir=output)
        message = str(refused.value)
        assert re.search(rf"{re.escape(field)}=", message), message
        assert f"optimizer.algorithm={algorithm!r}" in message
        with pytest.raises(ConfigError):
            run(config, output, cache_dir=cache_dir, progress=False)
        assert not output.exists()  # nothing written, not even the directory
        return
    checked = preflight(config, output_dir=output)
    assert checked.privacy.private == (algorithm in PRIVATE)
    assert checked.privacy.mechanism == (config.mechanism if algorithm in PRIVATE else None)
    assert not output.exists()
    if layout != "single":
        return  # the distributed runs are the marked tests' (tests/integration/test_distributed)
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert summary["steps"] == 2 and summary["algorithm"] == algorithm
    if algorithm in PRIVATE:
        assert summary["mechanism"] == config.mechanism
        assert 0 < summary["epsilon"] <= 3.0 * (1 + 1e-6)


def test_check_prints_what_the_run_would_do_and_writes_nothing(tmp_path, sentiment_files, capsys):
    train, test = sentiment_files
    output = tmp_path / "run"
    config = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
    overrides = [f"task.train_path={train}", f"task.test_path={test}", "tracking.backend=none"]
    code = main(["check", str(config), *overrides, "--output-dir", str(output)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    loaded = load_config(config, overrides)
    expected = preflight(loaded)
    assert f"σ = {expected.privacy.noise_multiplier:.6g} (calibrated)" in printed
    assert f"spends ε = {expected.privacy.epsilon:.6g} at δ = 1e-05 (add/remove" in printed
    replace_one = f"({2 * expected.privacy.epsilon:.6g}, "
    assert f"N = {len(expected.splits.train)}: the whole release is {replace_one}" in printed
    assert "layout      single, 1 worker(s)" in printed
    rows, truncation = expected.privacy.max_batch_size, expected.privacy.truncation_delta
    length = loaded.task.max_length  # the demo config's bound on its prompts
    assert f"batches     {rows} rows × {length} tokens, {rows} rows per" in printed
    # q = 64/64: every draw holds all N rows, so the bound is N + 1 and nothing is truncated
    assert rows == 65 and f"truncation takes δ {truncation:.3g}" in printed and truncation == 0
    assert f"steps       {loaded.optimizer.steps}" in printed
    assert "memory      no plan" in printed  # a built-in model: the planner needs its shape
    assert not output.exists()


def test_check_refuses_with_the_reason_and_exit_code_2(tmp_path, sentiment_files, capsys):
    train, test = sentiment_files
    config = REPO / "configs" / "runs" / "tiny-dpsgd.yaml"
    overrides = [
        f"task.train_path={train}",
        f"task.test_path={test}",
        "parallel.strategy=replica",
        "parallel.workers=2",
    ]
    code = main(["check", str(config), *overrides])
    error = capsys.readouterr().err
    assert code == 2
    assert "privzo: error: optimizer.algorithm='dpsgd' with parallel.strategy='replica'" in error


def test_check_prints_the_planners_memory_plan_of_a_cluster_config(tmp_path, capsys):
    """facebook/opt-13b: its shape is known by name, so the plan needs no weights (the data
    directory is the cluster's: stood in for by rows of the same shape)."""
    for split, count in (("train", 2000), ("test", 1000)):
        write_sentiment_jsonl(tmp_path / f"{split}.jsonl", count, seed=len(split))
    config = REPO / "configs" / "runs" / "opt-13b-dpzero-replica.yaml"
    code = main(["check", str(config), f"task.data_dir={tmp_path}", "tracking.backend=none"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    plan = preflight(load_config(config, [f"task.data_dir={tmp_path}"])).memory
    assert plan is not None and plan.strategy == "replica" and plan.fits
    assert f"{plan.parameters:,} parameters; replica on 8 GPU(s) of 80 GiB" in printed
    assert f"{plan.bytes_per_gpu / 2**30:.2f} GiB per GPU (fits; planner estimate)" in printed


# The README's own-data example: the shipped DPZero config on examples/reviews.csv, whose
# columns (review, sentiment) are not the defaults and whose labels are the words themselves.
OWN_DATA = [
    "task.train_path=examples/reviews.csv",
    "task.test_path=examples/reviews-test.csv",
    "task.template={review} It was",
    "task.label_field=sentiment",
]


def test_check_says_which_rows_the_readmes_own_data_example_trains_on(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the paths are the README's, relative to the checkout
    config = "configs/runs/tiny-dpzero.yaml"
    code = main(["check", config, *OWN_DATA, "tracking.backend=none"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (
        "data        task.train_path='examples/reviews.csv' (test rows from "
        "task.test_path='examples/reviews-test.csv')"
    ) in printed
    assert "rows        64 training, 32 test examples (prompt-classification)" in printed
    assert "labels      field 'sentiment': 0 or 'terrible' (" in printed
    assert "builtin" not in printed  # the shipped config's built-in dataset is replaced
    readme = (REPO / "README.md").read_text()
    assert all(argument.split("=")[0] in readme for argument in OWN_DATA)


def test_check_names_a_missing_training_file_instead_of_reading_the_builtin_dataset(capsys):
    config = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
    missing = ["task.train_path=no/such.csv", "task.test_path=no/test.csv"]
    code = main(["check", str(config), *missing, "tracking.backend=none"])
    assert code == 2
    assert "task.train_path='no/such.csv': dataset file does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["./checkpoints/mine", "/no/such/model", "ckpt/run1/final"])
@pytest.mark.parametrize("kind", ["auto", "causal"])
def test_a_missing_model_directory_is_refused_not_looked_up_on_the_hub(name, kind, capsys):
    config = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
    overrides = [f"model.name_or_path={name}", f"model.kind={kind}", "tracking.backend=none"]
    assert main(["check", str(config), *overrides]) == 2
    error = capsys.readouterr().err
    assert f"model.name_or_path={name!r}: no such directory; for a hub id write org/name" in error
