"""The papers' tasks: prompts, label words, fields and data sources, by name.

Masked-LM prompts and label words are LM-BFF's (Gao et al. 2021), as MeZO and DPZero use them for
RoBERTa-large; causal-LM prompts are MeZO's for OPT. Label ``i`` of a dataset is scored with label
word ``i``. A preset fills every task field the config leaves unset; a field the config sets wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HubSource:
    """Where a preset's data lives on the Hugging Face Hub, and which splits play which role."""

    dataset: str
    subset: str | None
    train_split: str = "train"
    test_split: str = "validation"
    revision: str | None = None  # branch, tag or commit for load_dataset (task.revision)


@dataclass(frozen=True)
class TaskPreset:
    name: str
    task_type: str  # "classification" or "generation"
    templates: dict[str, str]  # by model kind: "masked" / "causal"
    label_words: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by model kind
    label_field: str = "label"
    # What joins the prompt and a label word: a space, or nothing when the prompt ends a line.
    label_word_prefix: str = " "
    answer_field: str = "answers"
    source: HubSource | None = None
    metric: str = "accuracy"
    # Where a hub row keeps its reference answers, e.g. SQuAD's answers["text"]; they are
    # copied into ``answer_field`` as a plain list of strings.
    answers_from: tuple[str, str] | None = None


_NLI_MASKED = "{premise} ? {mask} , {hypothesis}"

PRESETS: dict[str, TaskPreset] = {
    preset.name: preset
    for preset in (
        TaskPreset(
            "sst2",
            "classification",
            templates={"masked": "{sentence} It was {mask} .", "causal": "{sentence} It was"},
            label_words={"masked": ("terrible", "great"), "causal": ("terrible", "great")},
            source=HubSource("glue", "sst2"),
        ),
        TaskPreset(
            "sst5",
            "classification",
            templates={"masked": "{text} It was {mask} ."},
            label_words={"masked": ("terrible", "bad", "okay", "good", "great")},
            source=HubSource("SetFit/sst5", None, test_split="test"),
        ),
        TaskPreset(
            "snli",
            "classification",
            templates={"masked": _NLI_MASKED},
            label_words={"masked": ("Yes", "Maybe", "No")},
            source=HubSource("stanfordnlp/snli", None, test_split="test"),
        ),
        TaskPreset(
            "mnli",
            "classification",
            templates={"masked": _NLI_MASKED},
            label_words={"masked": ("Yes", "Maybe", "No")},
            source=HubSource("glue", "mnli", test_split="validation_matched"),
        ),
        TaskPreset(
            "rte",
            "classification",
            templates={"masked": _NLI_MASKED},
            label_words={"masked": ("Yes", "No")},
            source=HubSource("super_glue", "rte"),
        ),
        TaskPreset(
            "trec",
            "classification",
            templates={"masked": "{mask} : {text}"},
            label_words={
                "masked": ("Expression", "Entity", "Description", "Human", "Location", "Number")
            },
            label_field="coarse_label",
            source=HubSource("CogComp/trec", None, test_split="test"),
        ),
        TaskPreset(
            "squad",
            "generation",
            templates={
                "causal": "Title: {title}\nContext: {context}\nQuestion: {question}\nAnswer:"
            },
            source=HubSource("rajpurkar/squad", None),
            metric="f1",
            answers_from=("answers", "text"),
        ),
        TaskPreset(
            "drop",
            "generation",
            templates={"causal": "Passage: {passage}\nQuestion: {question}\nAnswer:"},
            source=HubSource("ucinlp/drop", None),
            metric="f1",
            answers_from=("answers_spans", "spans"),
        ),
        TaskPreset(
            "boolq",
            "classification",
            # MeZO's BoolQ prompt: the question ends with "?" and the answer starts a new line.
            templates={"causal": "{passage} {question}?\n"},
            label_words={"causal": ("No", "Yes")},
            label_word_prefix="",
            source=HubSource("super_glue", "boolq"),
        ),
    )
}


def get_preset(name: str) -> TaskPreset | None:
    """The preset called ``name``, or None for the custom 'prompt-classification' task."""
    return PRESETS.get(name)
