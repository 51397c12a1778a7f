"""The training loop's progress bar keeps showing ε while the ε curve's thread lags behind, and
a resumed run knows which ε its record lacks."""

from __future__ import annotations

from privzo.algorithms.loop import bar_postfix, lacking_epsilon


def test_the_bar_keeps_the_newest_epsilon_while_the_curve_lags():
    ready = bar_postfix({"epsilon_spent": 0.51234, "train_loss": 0.7}, latest_epsilon=0.51234)
    assert ready == {"epsilon_spent": "0.512", "train_loss": "0.7"}
    lagging = bar_postfix({"train_loss": 0.65}, latest_epsilon=0.51234)
    assert lagging == {"train_loss": "0.65", "epsilon_spent": "0.512"}
    assert bar_postfix({"train_loss": 0.65, "other": 1.0}, latest_epsilon=None) == {
        "train_loss": "0.65"
    }


def test_a_resumed_run_fills_the_epsilon_its_record_lacks_up_to_its_start():
    # killed right after window 10, whose ε the curve's thread had not handed out yet
    assert lacking_epsilon(10, 5, window_ends={5, 10}, logged={5}) == [10]
    # a new tracking run (the store lost) holds only the unsent window: every grid end is due
    assert lacking_epsilon(10, 5, window_ends={10}, logged=set()) == [5, 10]
    # resumed inside a window: its start and the record's off-grid ends, none past the start
    assert lacking_epsilon(37, 5, window_ends={30, 35}, logged={5, 10, 15, 20, 25, 30}) == [35, 37]
    assert lacking_epsilon(52, 5, window_ends={42, 47, 52, 57}, logged=range(5, 51, 5)) == [
        42,
        47,
        52,
    ]
    assert lacking_epsilon(12, 5, window_ends={5, 10, 12}, logged={5, 10, 12}) == []
    assert lacking_epsilon(0, 5, window_ends=(), logged=()) == []  # a fresh run
