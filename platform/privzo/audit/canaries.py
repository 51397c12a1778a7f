"""Canaries: random records added to the private training set, each by a secret fair coin.

A canary is a prompt whose text field(s) hold a random sequence of words drawn from the model's
own vocabulary (whole-word tokens the tokenizer knows, label words left out) and whose label is
drawn at random: in effect a mislabelled nonsense sentence. Such a record is far from the data, so
the model fits it only if it trains on it, and two canaries share little but their label word
(the scores are compared within a label, ``privzo.audit.scores.centre_by_label``), so one
canary's effect on the weights says little about another's. Words from the training rows would
share far more: the demo's private task has 77 distinct words. The canaries and the coins come
from the operating system's entropy (``secrets``) and are never logged or released: only counts
leave. They are kept, readable by their owner only, in the audit's directory
(``privzo.audit.draw``), so a stopped audit goes on with them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from privzo.audit.draw import CanaryDraw
from privzo.config.tasks import TaskConfig, template_fields
from privzo.section import ConfigError
from privzo.tasks.data import Row

# Private rows (not canaries) the white-box scores replay beside the canaries: their mean
# derivative along z_t is the data's shared direction, which moves every g_t alike.
REFERENCE_ROWS = 64


def secret_generator() -> np.random.Generator:
    """A numpy generator seeded from the OS entropy pool; its seed is never stored."""
    return np.random.default_rng(secrets.randbits(128))


def draw_coins(count: int) -> np.ndarray:
    """``count`` independent fair coins (True = the canary is trained on), from ``secrets``."""
    bits = secrets.randbits(count)
    return np.array([(bits >> index) & 1 == 1 for index in range(count)], dtype=bool)


def check_canary_count(count: int, rows: list[Row]) -> None:
    """Refuse more canaries than training rows: then the canaries, not the data, make the run
    (the batch composition, the sample rate and what the model learns), and the audit would
    measure a different run from the one the config describes."""
    if count > len(rows):
        raise ConfigError(
            f"--canaries={count}: more canaries than the {len(rows)} private training rows "
            f"they would be mixed into; allowed: 2..{len(rows)} (or a larger training set)"
        )


def tokenizer_words(tokenizer, excluded: Sequence[str]) -> list[str]:
    """The tokenizer's whole-word alphabetic tokens as text, without ``excluded`` (label
    words) and special tokens, sorted: the canaries' alphabet."""
    special = set(tokenizer.all_special_tokens)
    banned = {word.strip().lower() for word in excluded}
    words = set()
    for token in tokenizer.get_vocab():
        if token in special:
            continue
        text = tokenizer.convert_tokens_to_string([token]).strip()
        if text.isalpha() and text.lower() not in banned:
            words.add(text)
    return sorted(words)


def make_canaries(
    words: list[str], task: TaskConfig, count: int, words_per_field: int, rng: np.random.Generator
) -> list[Row]:
    """``count`` random mislabelled records shaped like the task's rows."""
    if task.label_words is None or task.template is None:
        raise ConfigError("the audit's canaries need a classification task (label words)")
    if len(words) < 2:
        raise ConfigError(f"the tokenizer has {len(words)} usable words: too few for canaries")
    fields = template_fields(task.template)
    label_field = task.label_field or "label"
    canaries = []
    for _ in range(count):
        row: Row = {name: " ".join(rng.choice(words, size=words_per_field)) for name in fields}
        row[label_field] = int(rng.integers(len(task.label_words)))
        canaries.append(row)
    return canaries


@dataclass
class CanaryInjection:
    """The run's ``training_rows`` hook: checks the count against the training rows, makes the
    canaries and adds the ones whose coin came up "in". Holds the canaries and coins for
    scoring; ``keep`` saves a new draw before the run trains (``privzo.audit.draw``), and a
    ``saved`` one (a resumed run's) is used instead of drawing again."""

    count: int
    words_per_field: int
    alphabet: Callable[[TaskConfig], list[str]]  # the words canaries are drawn from
    saved: CanaryDraw | None = field(default=None, repr=False)
    keep: Callable[[CanaryDraw], None] | None = field(default=None, repr=False)
    draw: CanaryDraw | None = field(default=None, repr=False)
    canaries: list[Row] = field(default_factory=list, repr=False)
    included: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)
    training_rows: int = 0  # the private rows before the canaries (public: the data's size)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    references: list[Row] = field(default_factory=list, repr=False)  # REFERENCE_ROWS private rows

    def __call__(self, task: TaskConfig, rows: list[Row]) -> list[Row]:
        check_canary_count(self.count, rows)
        draw = self.saved or self._new_draw(task, rows)
        _check_draw(draw, self.count, rows)
        self.draw, self.canaries, self.included = draw, draw.canaries, draw.included
        label_field = task.label_field or "label"
        self.labels = np.array([row[label_field] for row in self.canaries], dtype=np.int64)
        self.training_rows = len(rows)
        self.references = [rows[index] for index in draw.references]
        if self.saved is None and self.keep is not None:
            self.keep(draw)  # on disk before the first step: a resumed run trains on these rows
        return [
            *rows,
            *(row for row, kept in zip(self.canaries, self.included, strict=True) if kept),
        ]

    def _new_draw(self, task: TaskConfig, rows: list[Row]) -> CanaryDraw:
        canaries = make_canaries(
            self.alphabet(task), task, self.count, self.words_per_field, secret_generator()
        )
        picked = secret_generator().permutation(len(rows))[:REFERENCE_ROWS]
        return CanaryDraw(canaries, draw_coins(self.count), [int(i) for i in picked], len(rows))


def _check_draw(draw: CanaryDraw, count: int, rows: list[Row]) -> None:
    """A saved draw fits the rows the task loaded now (the same data file as before)."""
    if len(draw.canaries) != count or draw.training_rows != len(rows):
        raise ConfigError(
            f"the audit's saved canaries were drawn for {len(draw.canaries)} canaries and "
            f"{draw.training_rows} private training rows, but this run has {count} and "
            f"{len(rows)} (the data file changed since): start the audit again with --overwrite "
            "or in a new directory"
        )
    if any(not 0 <= index < len(rows) for index in draw.references):
        raise ConfigError("the audit's saved reference rows are out of range of the training rows")
