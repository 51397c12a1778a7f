"""Evaluation metrics for the papers' task suite: accuracy, exact match and token F1.

MeZO, DPZero and DP-ZO score classification tasks by accuracy and the generation tasks (SQuAD,
DROP) by exact match and F1 after SQuAD v1.1 answer normalization. Numbers are only comparable
with the papers if the normalization is the same, so it follows that definition exactly, quirks
included: punctuation is deleted rather than replaced by a space ("1,000" == "1000", but also
"well-known" == "wellknown"), and only ASCII punctuation (``string.punctuation``) is removed, so
curly quotes, dashes and other Unicode punctuation survive and count against a match.

Every function returns a fraction in [0, 1]; the papers report it multiplied by 100.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

_PUNCTUATION = str.maketrans("", "", string.punctuation)
# `\b` is Unicode-aware, as in the reference definition: "theater" keeps its "the", while an
# article next to non-ASCII punctuation ("the—cat") is still a whole word and is removed.
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalization, so that answers differing only in surface form compare equal.

    Lowercase, delete ``string.punctuation``, drop the whole words a / an / the, collapse
    whitespace. The order matters: punctuation goes first, so "the-end" becomes the single word
    "theend" and keeps its article.
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _check_references(references: Sequence[str]) -> None:
    """A bare string would be iterated character by character and silently score nonsense."""
    if isinstance(references, str):
        raise TypeError(
            f"references must be a sequence of answer strings, not a single str {references!r}; "
            "wrap it in a list"
        )
    if len(references) == 0:
        raise ValueError("references is empty: each example needs at least one reference answer")


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized reference; SQuAD and DROP list
    several acceptable answers per question, and matching any one of them counts."""
    _check_references(references)
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(ref) for ref in references))


def _token_f1(predicted: list[str], reference: list[str]) -> float:
    """Harmonic mean of token precision and recall, counting overlap as a multiset so that a
    repeated word is only credited as many times as it appears on both sides."""
    if not predicted or not reference:
        return float(predicted == reference)  # both empty: 1.0; only one empty: 0.0
    overlap = sum((Counter(predicted) & Counter(reference)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(reference)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, references: Sequence[str]) -> float:
    """Token F1 against the best-matching reference, giving partial credit for partly right
    answers (e.g. the right name with an extra word)."""
    _check_references(references)
    predicted = normalize_answer(prediction).split()
    return max(_token_f1(predicted, normalize_answer(ref).split()) for ref in references)


def _check_pairs(predictions: Sequence[Any], targets: Sequence[Any], name: str) -> None:
    """A length mismatch means predictions and targets are misaligned; an empty set has no mean."""
    if len(predictions) != len(targets):
        raise ValueError(
            f"{len(predictions)} predictions but {len(targets)} {name}: they must align one to one"
        )
    if len(predictions) == 0:
        raise ValueError(f"no predictions and no {name}: the metric is undefined on an empty set")


def accuracy(predictions: Sequence[Any], labels: Sequence[Any]) -> float:
    """Fraction of predictions equal to their label (classification tasks)."""
    _check_pairs(predictions, labels, "labels")
    return sum(bool(p == y) for p, y in zip(predictions, labels, strict=True)) / len(labels)


def mean_exact_match(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Exact match averaged over a dataset, one list of reference answers per prediction."""
    _check_pairs(predictions, references, "reference lists")
    return sum(map(exact_match, predictions, references)) / len(predictions)


def mean_f1(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Token F1 averaged over a dataset, one list of reference answers per prediction."""
    _check_pairs(predictions, references, "reference lists")
    return sum(map(f1_score, predictions, references)) / len(predictions)


METRICS: dict[str, Callable[[Sequence[Any], Sequence[Any]], float]] = {
    "accuracy": accuracy,
    "exact_match": mean_exact_match,
    "f1": mean_f1,
}

__all__ = [
    "METRICS",
    "accuracy",
    "exact_match",
    "f1_score",
    "mean_exact_match",
    "mean_f1",
    "normalize_answer",
]
