"""The ε memo's store: a later process reads what an earlier one evaluated, for the same code only.

A calibration of the discrete Gaussian costs about ten PLD evaluations of seconds each; a rerun,
a resumed run and a search's next trial repeat them. Each case uses its own ``EpsilonMemo`` as a
fresh process would, over a real calibration's evaluations.
"""

from __future__ import annotations

import ast
import json

import pytest

from privzo.privacy import calibrate_noise_multiplier, compute_epsilon, keep_epsilons_in
from privzo.privacy.accountants.memo import (
    EPSILONS,
    STORE_NAME,
    EpsilonMemo,
    code_fingerprint,
)

TARGET = {"epsilon": 2.0, "delta": 1e-5, "sample_rate": 0.05, "steps": 30, "accountant": "pld"}


def _never(key):
    def compute() -> float:
        raise AssertionError(f"evaluated again: {key}")

    return compute


@pytest.fixture
def kept_in(tmp_path):
    """The process's memo kept in ``tmp_path`` for one test, then as it was."""
    previous = EPSILONS.store
    keep_epsilons_in(tmp_path)
    yield tmp_path
    EPSILONS.keep_in(None if previous is None else previous.parent)


def test_a_later_process_reads_a_calibrations_evaluations_without_evaluating(kept_in):
    sigma = calibrate_noise_multiplier(**TARGET)
    entries = [json.loads(line) for line in (kept_in / STORE_NAME).read_text().splitlines()]
    assert len(entries) >= 3  # the probes of one calibration
    assert {entry["code"] for entry in entries} == {code_fingerprint()}

    later = EpsilonMemo(16)
    later.keep_in(kept_in)
    for entry in entries:  # every stored evaluation answered from the store
        key = ast.literal_eval(entry["key"])  # the parameters' tuple, as evaluated
        assert later.get(key, _never(key)) == entry["epsilon"]
    # the stored values are the accountant's own: ε at the calibrated σ meets the target
    spent = compute_epsilon(
        noise_multiplier=sigma, **{k: TARGET[k] for k in TARGET if k != "epsilon"}
    )
    assert spent <= TARGET["epsilon"]


def test_another_codes_entries_and_damaged_lines_are_evaluated_anew(tmp_path):
    store = tmp_path / STORE_NAME
    lines = [
        json.dumps({"code": "another", "key": "('a',)", "epsilon": 9.0}),
        '{"code": "' + code_fingerprint() + '", "key": "(\'b\',)", "epsi',  # cut by a kill
        json.dumps({"code": code_fingerprint(), "key": "('c',)", "epsilon": "3"}),  # not a float
        json.dumps({"code": code_fingerprint(), "key": "('d',)", "epsilon": 4.0}),
    ]
    store.write_text("\n".join(lines) + "\n")
    memo = EpsilonMemo(16)
    memo.keep_in(tmp_path)
    evaluated = []

    def compute(value: float):
        def evaluate() -> float:
            evaluated.append(value)
            return value

        return evaluate

    assert memo.get(("a",), compute(1.0)) == 1.0
    assert memo.get(("b",), compute(2.0)) == 2.0
    assert memo.get(("c",), compute(3.0)) == 3.0
    assert memo.get(("d",), _never("d")) == 4.0
    assert evaluated == [1.0, 2.0, 3.0]
    # the new evaluations were appended, each on a line of its own
    fresh = EpsilonMemo(16)
    fresh.keep_in(tmp_path)
    for key, value in ((("a",), 1.0), (("b",), 2.0), (("c",), 3.0)):
        assert fresh.get(key, _never(key)) == value


def test_an_unwritable_store_is_only_a_miss(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the directory would be")
    memo = EpsilonMemo(16)
    memo.keep_in(blocked)  # neither readable nor writable as a directory
    assert memo.get(("x",), lambda: 5.0) == 5.0
    assert memo.get(("x",), _never("x")) == 5.0  # the process's memo still holds it


def test_a_store_past_its_size_starts_over(tmp_path, monkeypatch):
    from privzo.privacy.accountants import memo as memo_module

    store = tmp_path / STORE_NAME
    entry = json.dumps({"code": code_fingerprint(), "key": "('e',)", "epsilon": 6.0}) + "\n"
    store.write_text(entry * 3)
    monkeypatch.setattr(memo_module, "MAX_STORE_BYTES", 2 * len(entry))
    memo = EpsilonMemo(16)
    memo.keep_in(tmp_path)
    assert not store.exists()  # read as empty, and removed
    assert memo.get(("e",), lambda: 7.0) == 7.0  # evaluated anew, and stored again
    assert len(store.read_text().splitlines()) == 1
