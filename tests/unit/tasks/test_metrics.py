"""Accuracy, exact match and token F1 on hand-made answers, with SQuAD normalization corners."""

from __future__ import annotations

import pytest

from privzo.tasks.metrics import (
    METRICS,
    accuracy,
    exact_match,
    f1_score,
    mean_exact_match,
    mean_f1,
    normalize_answer,
)

# --- normalize_answer ----------------------------------------------------------------------------


def test_normalize_lowercases_and_collapses_whitespace():
    assert normalize_answer("  Denver\tBRONCOS \n\u00a0 Team ") == "denver broncos team"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Theater", "theater"),  # "the" inside a word is kept
        ("an answer", "answer"),  # "an" prefix of "answer" is kept
        ("another anthem", "another anthem"),
        ("A cat, a hat", "cat hat"),  # lowercased first, so "A" is an article too
        ("theatre of the absurd", "theatre of absurd"),
    ],
)
def test_normalize_removes_articles_only_as_whole_words(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_deletes_punctuation_without_inserting_space():
    assert normalize_answer("1,000") == normalize_answer("1000") == "1000"
    assert normalize_answer("3.14") == "314"
    # Deletion glues words: a quirk of the definition that the papers' numbers include.
    assert normalize_answer("well-known") == "wellknown"
    # Punctuation goes before articles, so "the-end" is one word and keeps its "the".
    assert normalize_answer("the-end") == "theend"
    assert normalize_answer("Levi's Stadium!") == "levis stadium"


def test_normalize_keeps_unicode_punctuation_outside_string_punctuation():
    # Curly quotes, the right single quote and the em dash are not in string.punctuation: they
    # survive, so a prediction with them does not match the plain answer.
    assert normalize_answer("“Paris”") == "“paris”"
    assert normalize_answer("l’amour") == "l’amour"
    assert exact_match("“Paris”", ["Paris"]) == 0.0
    assert exact_match("Levi’s Stadium", ["Levi's Stadium"]) == 0.0
    # `\b` treats the em dash as a word boundary, so the article next to it is still removed.
    assert normalize_answer("the—cat") == "—cat"


# --- exact_match ---------------------------------------------------------------------------------


def test_exact_match_ignores_case_whitespace_articles_and_punctuation():
    assert exact_match("  the DENVER   broncos. ", ["Denver Broncos"]) == 1.0
    assert exact_match("1,000 people", ["1000 people"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0


def test_exact_match_takes_any_reference():
    assert exact_match("Santa Clara", ["Levi's Stadium", "santa clara"]) == 1.0
    assert exact_match("Santa Clara", ["Levi's Stadium", "California"]) == 0.0


def test_exact_match_with_empty_strings():
    assert exact_match("", ["Paris"]) == 0.0
    assert exact_match("Paris", [""]) == 0.0
    assert exact_match("", [""]) == 1.0
    # An answer of only articles and punctuation normalizes to empty and matches "".
    assert exact_match("The.", [""]) == 1.0


# --- f1_score ------------------------------------------------------------------------------------


def test_f1_partial_overlap_by_hand():
    # pred: super bowl 50 in santa clara (6 tokens); ref: levis stadium in santa clara california
    # (6 tokens); common: in, santa, clara = 3 -> P = 3/6, R = 3/6, F1 = 2*0.5*0.5/1.0 = 0.5
    score = f1_score("Super Bowl 50 in Santa Clara", ["Levi's Stadium in Santa Clara, California"])
    assert score == pytest.approx(0.5)
    # pred: denver broncos won (3); ref: denver broncos (2, "the" dropped); common = 2
    # -> P = 2/3, R = 2/2 = 1, F1 = 2*(2/3)*1 / (2/3 + 1) = (4/3) / (5/3) = 0.8
    assert f1_score("Denver Broncos won", ["the Denver Broncos"]) == pytest.approx(0.8)


def test_f1_exact_and_disjoint():
    assert f1_score("The Denver Broncos!", ["denver broncos"]) == 1.0
    assert f1_score("Carolina Panthers", ["Denver Broncos"]) == 0.0


def test_f1_counts_repeated_tokens_as_a_multiset():
    # "the the cat" -> ["cat"] (articles dropped); "cat cat" -> ["cat", "cat"]; common = 1
    # -> P = 1/1, R = 1/2, F1 = 2*1*0.5 / 1.5 = 2/3 (a set overlap would give 1.0)
    assert f1_score("the the cat", ["cat cat"]) == pytest.approx(2 / 3)
    # ["cat", "cat", "dog"] vs ["cat", "dog", "dog"]: common = cat x1 + dog x1 = 2
    # -> P = 2/3, R = 2/3, F1 = 2/3
    assert f1_score("cat cat dog", ["cat dog dog"]) == pytest.approx(2 / 3)
    # ["cat"] x3 vs ["cat"]: common = 1 -> P = 1/3, R = 1, F1 = (2/3) / (4/3) = 0.5
    assert f1_score("cat cat cat", ["cat"]) == pytest.approx(0.5)


def test_f1_takes_the_best_reference():
    # first reference: disjoint -> 0; second: pred "santa clara" (2) vs "santa clara california"
    # (3), common 2 -> P = 1, R = 2/3, F1 = (4/3) / (5/3) = 0.8
    score = f1_score("Santa Clara", ["Levi's Stadium", "Santa Clara, California"])
    assert score == pytest.approx(0.8)


def test_f1_empty_token_convention():
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("Paris", [""]) == 0.0
    assert f1_score("", [""]) == 1.0
    assert f1_score("a an the", ["..."]) == 1.0  # both normalize to no tokens
    assert f1_score("", ["Paris", ""]) == 1.0  # max over references picks the empty one


@pytest.mark.parametrize("metric", [exact_match, f1_score])
def test_per_example_metrics_reject_bad_references(metric):
    with pytest.raises(ValueError, match="references is empty"):
        metric("Paris", [])
    with pytest.raises(TypeError, match="not a single str"):
        metric("Paris", "Paris")


# --- accuracy and dataset means ------------------------------------------------------------------


def test_accuracy():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(["great", "terrible"], ["great", "terrible"]) == 1.0
    assert accuracy([0], [1]) == 0.0


@pytest.mark.parametrize("metric", [accuracy, mean_exact_match, mean_f1])
def test_dataset_metrics_reject_mismatch_and_empty(metric):
    with pytest.raises(ValueError, match="must align"):
        metric(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="empty set"):
        metric([], [])


def test_mean_exact_match_and_f1_over_a_dataset():
    predictions = ["Denver Broncos", "Santa Clara", "1,000", ""]
    references = [
        ["the Denver Broncos"],
        ["Levi's Stadium", "Santa Clara, California"],
        ["1000"],
        ["x"],
    ]
    # EM per example: 1, 0, 1, 0 -> 2/4
    assert mean_exact_match(predictions, references) == pytest.approx(0.5)
    # F1 per example: 1, 0.8 (see test_f1_takes_the_best_reference), 1, 0 -> 2.8/4 = 0.7
    assert mean_f1(predictions, references) == pytest.approx(0.7)


def test_metrics_registry_dispatches_to_dataset_functions():
    assert set(METRICS) == {"accuracy", "exact_match", "f1"}
    assert METRICS["accuracy"]([1, 2, 3], [1, 2, 0]) == pytest.approx(2 / 3)
    assert METRICS["exact_match"](["Paris", "Rome"], [["paris"], ["Milan"]]) == 0.5
    assert METRICS["f1"](["Denver Broncos won"], [["the Denver Broncos"]]) == pytest.approx(0.8)
