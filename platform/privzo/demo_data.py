"""A small synthetic language with a sentiment structure, for the offline demo and the tests.

Nothing here is downloaded: the public pretraining corpus and the private task are generated
from a seed, so the README demo and the test suite run anywhere and give the same numbers.

Why the demo is honest and meaningful:

* The **public corpus** teaches the words. Opinion sentences about everyday *public subjects*
  (the soup, the bus, ...) pair sentiment adjectives with each other and with a reaction of the
  same polarity ("the soup was bland , so ava frowned ."; "what a lovely cozy garden !"), so
  adjectives acquire a sentiment direction from context; a contrastive form teaches that after
  "but" the second clause decides. Adjective frequencies are Zipfian, so some are rare.
* The label words are **rare feelings there, never verdicts**: "great"/"terrible" occur only
  in about 1 % of sentences, as "<name> felt great" after a matching opinion; "it was" is only
  ever followed by a time word ("it was monday"). So zero-shot scoring of
  "{review} It was" -> great/terrible is near chance: the knowledge is in the model, the
  mapping to the label words is not.
* The **private task** is another register: product and place *reviews* with their own
  openers ("we booked the hotel . the staff was lovely .") about *private subjects* that the
  corpus only mentions in neutral sentences; 30 % are contrastive ("the price was poor but the
  staff was lovely": label from the clause after "but").
* Private **train and test use disjoint adjectives** and reviews never contain a label word, so
  no single token shared by train and test decides the label: fine-tuning has to map the
  pretrained sentiment direction onto the two label words, a low-dimensional adaptation that
  zeroth-order methods manage in a few hundred steps.

Disjointness from the corpus holds by construction: every review starts with a review opener
("i tried", "we booked", "my friend bought", "last week", ...), whose first word never starts a
corpus sentence; the tests check it on generated data too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

LABEL_WORDS: tuple[str, str] = ("terrible", "great")
TEMPLATE = "{sentence} It was"

POSITIVE_ADJECTIVES: tuple[str, ...] = (
    "delicious", "wonderful", "lovely", "superb", "brilliant", "charming", "pleasant",
    "excellent", "delightful", "fantastic", "amazing", "fresh", "friendly", "beautiful",
    "perfect", "cozy", "clean", "tasty", "elegant", "splendid", "marvelous", "gorgeous",
    "enjoyable", "cheerful",
)  # fmt: skip
NEGATIVE_ADJECTIVES: tuple[str, ...] = (
    "awful", "horrible", "bland", "dreadful", "boring", "rude", "dirty", "stale",
    "disappointing", "poor", "ugly", "broken", "dull", "nasty", "miserable", "noisy", "greasy",
    "shabby", "gloomy", "tedious", "clumsy", "lousy", "sloppy", "unpleasant",
)  # fmt: skip
POSITIVE_REACTIONS: tuple[str, ...] = (
    "smiled", "laughed", "cheered", "felt glad", "stayed longer", "came back", "sang",
    "relaxed", "danced", "clapped",
)  # fmt: skip
NEGATIVE_REACTIONS: tuple[str, ...] = (
    "frowned", "complained", "sighed", "felt sad", "left early", "gave up", "shouted",
    "groaned", "walked out", "yawned",
)  # fmt: skip
PUBLIC_SUBJECTS: tuple[str, ...] = (
    "soup", "weather", "bus", "party", "garden", "game", "song", "coffee", "train", "lesson",
    "picnic", "street", "bread", "show", "trip", "market", "park", "dinner", "festival", "walk",
    "beach", "class", "cake", "road",
)  # fmt: skip
PRIVATE_SUBJECTS: tuple[str, ...] = (
    "hotel", "laptop", "restaurant", "phone", "museum", "camera", "apartment", "concert",
    "headphones", "bakery", "novel", "gym", "airline", "sofa", "theater", "blender",
)  # fmt: skip
PRIVATE_ASPECTS: tuple[str, ...] = (
    "service", "design", "price", "quality", "staff", "room", "screen", "sound", "food",
    "seats", "battery", "lighting",
)  # fmt: skip
REVIEW_OPENERS: tuple[str, ...] = (
    "i tried the", "we booked the", "my friend bought the", "last week i visited the",
    "i ordered the", "we checked out the",
)  # fmt: skip
NAMES: tuple[str, ...] = (
    "ava", "ben", "cleo", "dan", "emma", "finn", "gina", "hugo", "iris", "jack", "kate", "leo",
    "mia", "noah", "olga", "paul",
)  # fmt: skip
TIMES: tuple[str, ...] = (
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "noon",
    "midnight", "morning", "evening", "late", "early", "spring", "winter",
)  # fmt: skip
PLACES: tuple[str, ...] = ("station", "library", "river", "bridge", "square", "school", "office")
NEUTRAL_ACTIONS: tuple[str, ...] = (
    "went home", "read a book", "called a friend", "took the bus", "made tea", "opened the door",
    "wrote a letter", "cleaned the kitchen",
)  # fmt: skip

_PUNCTUATION = (".", ",", ":", "!", "?")
ZIPF_EXPONENT = 1.0
CONTRAST_FRACTION = 0.3
LABEL_WORD_RATE = 0.02


def vocabulary() -> list[str]:
    """Every word the generators can produce (plus punctuation), in a fixed order.

    The tokenizer is built from this list, so each word is exactly one token.
    """
    phrases: Iterable[str] = (
        *LABEL_WORDS, *POSITIVE_ADJECTIVES, *NEGATIVE_ADJECTIVES, *POSITIVE_REACTIONS,
        *NEGATIVE_REACTIONS, *PUBLIC_SUBJECTS, *PRIVATE_SUBJECTS, *PRIVATE_ASPECTS,
        *REVIEW_OPENERS, *NAMES, *TIMES, *PLACES, *NEUTRAL_ACTIONS,
        "the a and so because but said it was is near on to of at what", *_PUNCTUATION,
    )  # fmt: skip
    words: dict[str, None] = {}
    for phrase in phrases:
        for word in phrase.split():
            words.setdefault(word, None)
    return list(words)


def _zipf_weights(count: int) -> list[float]:
    """Word frequencies fall off like natural text, so some adjectives are rare in the corpus."""
    return [1.0 / (rank + 1) ** ZIPF_EXPONENT for rank in range(count)]


def _adjective(rng: random.Random, positive: bool) -> str:
    words = POSITIVE_ADJECTIVES if positive else NEGATIVE_ADJECTIVES
    return rng.choices(words, weights=_zipf_weights(len(words)))[0]


def _opinion(rng: random.Random) -> str:
    """A public opinion sentence: the reaction agrees with the adjective it follows or explains.

    The contrastive form teaches that after "but" the second clause decides the reaction.
    """
    positive = rng.random() < 0.5
    reactions = POSITIVE_REACTIONS if positive else NEGATIVE_REACTIONS
    if rng.random() < LABEL_WORD_RATE:  # the label words are rare feelings, never verdicts
        reactions = (f"felt {LABEL_WORDS[int(positive)]}",)
    subject, other = rng.sample(PUBLIC_SUBJECTS, 2)
    adjective, second = _adjective(rng, positive), _adjective(rng, positive)
    name, reaction = rng.choice(NAMES), rng.choice(reactions)
    form = rng.randrange(7)
    if form == 0:
        return f"the {subject} was {adjective} , so {name} {reaction} ."
    if form == 1:
        return f"{name} {reaction} because the {subject} was {adjective} ."
    if form == 2:
        return f"the {subject} was {adjective} and the {other} was {second} ."
    if form == 3:
        return (
            f"{name} went to the {subject} . the {subject} was {adjective} and {name} {reaction} ."
        )
    if form == 4:
        return f"the {subject} was {adjective} and {second} ."
    if form == 5:
        return f"what a {adjective} {second} {subject} !"
    opposite = _adjective(rng, not positive)
    return f"the {subject} was {opposite} but the {other} was {adjective} , so {name} {reaction} ."


def _neutral(rng: random.Random) -> str:
    """A public neutral sentence: teaches private subjects and 'it was <time>' without sentiment."""
    name, time = rng.choice(NAMES), rng.choice(TIMES)
    form = rng.randrange(3)
    if form == 0:
        return f"it was {time} and {name} {rng.choice(NEUTRAL_ACTIONS)} ."
    if form == 1:
        return f"the {rng.choice(PRIVATE_SUBJECTS)} is near the {rng.choice(PLACES)} ."
    return f"on {time} {name} went to the {rng.choice(PRIVATE_SUBJECTS)} ."


def public_corpus(num_sentences: int, seed: int = 0) -> list[str]:
    """The public pretraining text: two opinion sentences for every neutral one."""
    rng = random.Random(f"public-{seed}")
    return [_opinion(rng) if rng.random() < 2 / 3 else _neutral(rng) for _ in range(num_sentences)]


def _split_adjectives(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """Every third adjective is held out for the private test set."""
    test = [w for i, w in enumerate(words) if i % 3 == 2]
    return [w for w in words if w not in test], test


def _review(rng: random.Random, label: int, split: str) -> str:
    """One private review; its (last) adjective has the label's polarity.

    A fraction of reviews is contrastive ("the price was poor but the staff was lovely"): the
    clause after "but" decides the label, as in the public contrastive sentences.
    """
    positive_train, positive_test = _split_adjectives(POSITIVE_ADJECTIVES)
    negative_train, negative_test = _split_adjectives(NEGATIVE_ADJECTIVES)
    positives, negatives = (
        (positive_train, negative_train) if split == "train" else (positive_test, negative_test)
    )
    matching, opposite = (positives, negatives) if label == 1 else (negatives, positives)
    opener, subject = rng.choice(REVIEW_OPENERS), rng.choice(PRIVATE_SUBJECTS)
    aspect, other = rng.sample(PRIVATE_ASPECTS, 2)
    verdict = f"the {aspect} was {rng.choice(matching)}"
    if rng.random() < CONTRAST_FRACTION:
        verdict = f"the {other} was {rng.choice(opposite)} but {verdict}"
    return f"{opener} {subject} . {verdict} ."


def _balanced_rows(rng: random.Random, count: int, split: str) -> list[dict[str, object]]:
    labels = [i % 2 for i in range(count)]
    rng.shuffle(labels)
    return [{"sentence": _review(rng, label, split), "label": label} for label in labels]


def private_sentiment_task(
    num_train: int, num_test: int, seed: int = 0
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The private fine-tuning task: balanced binary review sentiment (0 terrible, 1 great).

    Scored as the next-token logits of ``LABEL_WORDS`` after ``TEMPLATE``.
    """
    rng = random.Random(f"private-{seed}")
    return _balanced_rows(rng, num_train, "train"), _balanced_rows(rng, num_test, "test")


def write_jsonl(rows: Iterable[dict[str, object]], path: str | Path) -> Path:
    """Write rows one JSON object a line (the format privzo's task loader reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path
