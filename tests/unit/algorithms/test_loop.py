"""The training loop's progress bar keeps showing ε while the ε curve's thread lags behind."""

from __future__ import annotations

from privzo.algorithms.loop import bar_postfix


def test_the_bar_keeps_the_newest_epsilon_while_the_curve_lags():
    ready = bar_postfix({"epsilon_spent": 0.51234, "train_loss": 0.7}, latest_epsilon=0.51234)
    assert ready == {"epsilon_spent": "0.512", "train_loss": "0.7"}
    lagging = bar_postfix({"train_loss": 0.65}, latest_epsilon=0.51234)
    assert lagging == {"train_loss": "0.65", "epsilon_spent": "0.512"}
    assert bar_postfix({"train_loss": 0.65, "other": 1.0}, latest_epsilon=None) == {
        "train_loss": "0.65"
    }
