"""ε after each window of a run, computed ahead in a background thread.

A private run logs the ε it has spent after every window. Evaluating it with PLD takes 0.2 to
0.5 s (one self-composition), as long as several GPU steps, so doing it between windows would
stall the device. The values depend only on public settings (σ, q, the step counts), so a
thread computes them from the start of training, in window order, and the loop logs each value
once it is ready (with its own step), waiting only at the end of the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from privzo.privacy.accountants import Accountant

__all__ = ["EpsilonCurve"]


class EpsilonCurve:
    """ε at given step counts, filled in by a daemon thread with its own accountant."""

    def __init__(
        self, make_accountant: Callable[[], Accountant], delta: float, step_counts: list[int]
    ) -> None:
        self.step_counts = list(step_counts)
        self._delta = delta
        self._make_accountant = make_accountant
        self._values: dict[int, float] = {}
        self._taken: set[int] = set()
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="privzo-epsilon", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            accountant = self._make_accountant()  # not shared: accountants cache, unlocked
            for steps in self.step_counts:
                if self._stop.is_set():
                    break
                self._values[steps] = accountant.epsilon_at(steps, self._delta)
        except Exception as error:  # handed to the training thread, raised there
            self._error = error
        finally:
            self._done.set()

    def take_ready(self, through: int | None = None) -> list[tuple[int, float]]:
        """(steps, ε) for every computed value not taken yet, in step order; with ``through``,
        only those of step counts up to it (the thread runs ahead of training, and a value is
        logged only once its steps are done)."""
        self._raise_if_failed()
        ready = [
            (s, self._values[s])
            for s in self.step_counts
            if s in self._values and (through is None or s <= through)
        ]
        fresh = [(s, value) for s, value in ready if s not in self._taken]
        self._taken.update(s for s, _ in fresh)
        return fresh

    def take_rest(self) -> list[tuple[int, float]]:
        """Waits for the thread, then every value not taken yet."""
        self._done.wait()
        return self.take_ready()

    def take_through(self, steps: int) -> list[tuple[int, float]]:
        """Waits until every value up to ``steps`` is computed, then takes those not taken."""
        wanted = [count for count in self.step_counts if count <= steps]
        while not self._done.is_set() and any(count not in self._values for count in wanted):
            self._done.wait(0.05)
        return self.take_ready(through=steps)

    def close(self) -> None:
        """Stop after the value in progress and wait for it: a run that stops early (a signal
        too) computes no more values, and no daemon thread is left inside an accountant's
        compiled code (scipy's FFT) when the interpreter finalizes, which C++ code can turn
        into an abort."""
        self._stop.set()
        self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"computing the epsilon curve failed: {self._error}") from (
                self._error
            )
