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

Two designs (``privzo.audit.config.CanaryDesign``). ``random-words``: the words at random and the
label at random. ``large-gradient``: made for the white-box scores of zeroth-order runs, whose
signal grows with the canary's directional derivatives d_c(z) = ∇l_c·z against the data's. The
base model (public) is asked, before the run, which of a random sample of the words make the
largest loss gradient when a prompt repeats them under the label the model finds least likely;
each canary is then drawn from the loudest quarter of those words and labelled against the base
model's preference (a mislabelled record, by the model's own reading). Nothing of the private
data or of the run's outcome enters the choice.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from privzo.audit.draw import CanaryDraw
from privzo.config.tasks import TaskConfig, template_fields
from privzo.section import ConfigError
from privzo.tasks.data import Row

# Private rows (not canaries) the white-box scores replay beside the canaries: their mean
# derivative along z_t is the data's shared direction, which moves every g_t alike.
REFERENCE_ROWS = 64
# The large-gradient design: words whose gradient the base model is asked about, and the share
# of the loudest kept as the canaries' alphabet.
PROBED_WORDS = 256
LOUD_SHARE = 0.25


class CanaryProbe(Protocol):
    """The base model's answers the large-gradient design needs (``privzo.audit.probe``)."""

    def disfavoured_labels(self, rows: list[Row]) -> np.ndarray: ...

    def gradient_sizes(self, rows: list[Row]) -> np.ndarray: ...


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


def label_against_model(rows: list[Row], task: TaskConfig, probe: CanaryProbe) -> list[Row]:
    """``rows`` labelled with the label the base model finds least likely for each."""
    label_field = task.label_field or "label"
    labels = probe.disfavoured_labels(rows)
    return [{**row, label_field: int(label)} for row, label in zip(rows, labels, strict=True)]


def loud_words(
    words: list[str],
    task: TaskConfig,
    words_per_field: int,
    rng: np.random.Generator,
    probe: CanaryProbe,
    probed_words: int = PROBED_WORDS,
) -> list[str]:
    """The loudest ``LOUD_SHARE`` of up to ``probed_words`` random words: those whose prompt
    (the word repeated ``words_per_field`` times, labelled against the base model) has the
    largest loss gradient on the base model."""
    assert task.template is not None
    fields = template_fields(task.template)
    sample = [str(word) for word in rng.permutation(words)[:probed_words]]
    label_field = task.label_field or "label"
    prompts: list[Row] = [  # label 0 until the base model's disfavoured one replaces it
        {**{name: " ".join([word] * words_per_field) for name in fields}, label_field: 0}
        for word in sample
    ]
    sizes = probe.gradient_sizes(label_against_model(prompts, task, probe))
    keep = max(2, round(LOUD_SHARE * len(sample)))
    return [sample[int(index)] for index in np.argsort(-sizes, kind="stable")[:keep]]


def make_large_gradient_canaries(
    words: list[str],
    task: TaskConfig,
    count: int,
    words_per_field: int,
    rng: np.random.Generator,
    probe: CanaryProbe,
    probed_words: int = PROBED_WORDS,
) -> list[Row]:
    """``count`` records of the base model's loudest words, labelled against its preference."""
    alphabet = loud_words(words, task, words_per_field, rng, probe, probed_words)
    drafts = make_canaries(alphabet, task, count, words_per_field, rng)
    return label_against_model(drafts, task, probe)


@dataclass
class CanaryInjection:
    """The run's ``training_rows`` hook: checks the count against the training rows, makes the
    canaries and adds the ones whose coin came up "in". Holds the canaries and coins for
    scoring; ``keep`` saves a new draw before the run trains (``privzo.audit.draw``), and a
    ``saved`` one (a resumed run's) is used instead of drawing again."""

    count: int
    words_per_field: int
    alphabet: Callable[[TaskConfig], list[str]]  # the words canaries are drawn from
    # the base model's answers: given, the large-gradient design; None, random words
    probe: Callable[[TaskConfig], CanaryProbe] | None = None
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
        words, rng = self.alphabet(task), secret_generator()
        if self.probe is None:
            canaries = make_canaries(words, task, self.count, self.words_per_field, rng)
        else:
            canaries = make_large_gradient_canaries(
                words, task, self.count, self.words_per_field, rng, self.probe(task)
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
