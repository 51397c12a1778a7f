"""Prompt-based classification scored from the LM head (LM-BFF / MeZO style).

Each example becomes a prompt such as ``"<sentence> It was"`` and its class is read from the LM
head's logits for single-token label words (``terrible`` / ``great``) at one position: the last
token for a causal LM, the ``{mask}`` slot for a masked LM. All candidates are scored from one
forward pass per batch, and the vocabulary projection runs only at that position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from privzo.config.tasks import TaskConfig, template_fields
from privzo.section import ConfigError
from privzo.tasks.data import Row, hash_order
from privzo.tasks.interface import Indices
from privzo.tasks.label_words import label_word_tokens
from privzo.tasks.scoring import logits_at, model_device, no_cache, scoring_mode


@dataclass
class EncodedExamples:
    """Tokenised prompts, the position scored in each, and labels; no raw text kept."""

    input_ids: list[list[int]]
    positions: list[int]
    labels: np.ndarray
    # each prompt's tokens cut off its start to fit max_length (empty: none counted), so a run
    # can say when a limit cuts most of the text away
    cut_tokens: list[int] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    def head(self, count: int) -> EncodedExamples:
        """The first ``count`` examples: each row is encoded alone, so this is their encoding
        without encoding them again."""
        return EncodedExamples(
            self.input_ids[:count],
            self.positions[:count],
            self.labels[:count],
            self.cut_tokens[:count],
        )


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.numel())


def collate_examples(
    examples: EncodedExamples, indices: Indices, pad: int, length: int | None = None
) -> Batch:
    """The examples at ``indices`` right-padded to ``length`` tokens (None: to the longest of
    them), on the CPU."""
    if length is None:
        length = max(len(examples.input_ids[i]) for i in indices)
    input_ids = torch.full((len(indices), length), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(indices), length), dtype=torch.long)
    for row, index in enumerate(indices):
        ids = examples.input_ids[index]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    positions = torch.tensor([examples.positions[i] for i in indices], dtype=torch.long)
    labels = torch.from_numpy(examples.labels[np.asarray(indices, dtype=np.int64)])
    return Batch(input_ids, attention_mask, positions, labels)


class PromptClassificationTask:
    """Encodes rows into prompts and scores them from the LM head."""

    def __init__(
        self,
        config: TaskConfig,
        tokenizer: PreTrainedTokenizerBase,
        kind: str,
        position_limit: int | None = None,
    ) -> None:
        """``position_limit``: the most tokens the model's position table takes, if known."""
        self.config = config
        self.tokenizer = tokenizer
        self.kind = kind
        self.max_length = _max_length(config, position_limit)
        self.template = self._template_for(kind)
        self.candidates = self._candidate_tokens()
        # All single tokens: every candidate is read from one position of one forward pass.
        self.single_token = all(len(tokens) == 1 for tokens in self.candidates)
        self.label_token_ids = torch.tensor([tokens[0] for tokens in self.candidates])
        self._check_room_for_text()

    metric = "accuracy"

    @property
    def num_labels(self) -> int:
        return len(self.label_words)

    @property
    def label_words(self) -> list[str]:
        assert self.config.label_words is not None, "resolve the task config first"
        return self.config.label_words

    def _template_for(self, kind: str) -> str:
        template = self.config.template
        assert template is not None, "resolve the task config first"
        if kind == "causal" and "{mask}" in template:
            raise ConfigError(
                f"task.template={template!r} has '{{mask}}' but the model is a causal LM, which "
                "scores the token after the prompt; remove '{mask}'"
            )
        if kind == "masked":
            if self.tokenizer.mask_token is None:
                raise ConfigError("the masked LM's tokenizer has no mask token")
            if "{mask}" not in template:
                template = template + " {mask}"
        return template

    def _candidate_tokens(self) -> list[list[int]]:
        """The token ids of every label word as it follows the prompt (after a space, or
        directly after a prompt that ends a line): ``privzo.tasks.label_words``."""
        prefix = " " if self.config.label_word_prefix is None else self.config.label_word_prefix
        context, single = self._text_before_label(), self.kind == "masked"
        candidates = [
            label_word_tokens(self.tokenizer, word, prefix, context, single)
            for word in self.label_words
        ]
        if len({tuple(tokens) for tokens in candidates}) != len(candidates):
            raise ConfigError(f"task.label_words={self.label_words} map to equal tokens")
        return candidates

    def _text_before_label(self) -> str:
        """The template's text before the label word (a causal LM's prompt, or the text before
        a masked LM's mask slot), its fields left empty."""
        before = self.template.split("{mask}")[0]
        text = before.format(**dict.fromkeys(template_fields(before), ""))
        # a mask token absorbs the space before it (lstrip): the word takes the mask's place
        return text.rstrip(" ") if self.kind == "masked" else text

    def encode(self, rows: Sequence[Row]) -> EncodedExamples:
        input_ids, positions, cut = [], [], []
        fields = template_fields(self.template)
        for row in rows:
            full = self._prompt_ids({name: row[name].strip() for name in fields})
            ids, position = self._fit_prompt(full)
            input_ids.append(ids)
            positions.append(position)
            cut.append(len(full) - len(ids))
        label_field = self.config.label_field or "label"
        labels = np.array([int(row[label_field]) for row in rows], dtype=np.int64)
        return EncodedExamples(input_ids, positions, labels, cut)

    def public_example(self) -> EncodedExamples:
        """One example built from the template alone (empty fields, label 0): a forward input
        that holds no record, for ranks that must join a collective forward with no batch."""
        ids, position = self._encode_prompt(dict.fromkeys(template_fields(self.template), ""))
        return EncodedExamples([ids], [position], np.zeros(1, dtype=np.int64))

    def _check_room_for_text(self) -> None:
        """Refuse a ``task.max_length`` that the template alone fills: prompts are cut from the
        start, so every row's text would be cut away and the run would score at chance."""
        if self.config.max_length is None:
            return
        fixed = len(self._prompt_ids(dict.fromkeys(template_fields(self.template), "")))
        if self.config.max_length <= fixed:
            raise ConfigError(
                f"task.max_length={self.config.max_length} leaves no room for a row's text: "
                f"the template alone is {fixed} tokens (special tokens included) and longer "
                f"prompts lose their start; allowed: max_length ≥ {fixed + 1}, or null for the "
                "model's limit"
            )

    def _prompt_ids(self, texts: dict[str, str]) -> list[int]:
        """The prompt's token ids, not yet cut to ``max_length``."""
        tokenizer = self.tokenizer
        prompt = self.template.format(**texts, mask=tokenizer.mask_token or "")
        if self.kind != "causal":
            return list(tokenizer.encode(prompt, add_special_tokens=True))
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        return ids if tokenizer.bos_token_id is None else [tokenizer.bos_token_id, *ids]

    def _encode_prompt(self, texts: dict[str, str]) -> tuple[list[int], int]:
        return self._fit_prompt(self._prompt_ids(texts))

    def _fit_prompt(self, ids: list[int]) -> tuple[list[int], int]:
        """The prompt cut to ``max_length`` and the position scored in it."""
        tokenizer = self.tokenizer
        limit = self.max_length
        if (
            limit is not None and len(ids) > limit
        ):  # keep the first (special) token and the prompt's end
            ids = [ids[0], *ids[len(ids) - limit + 1 :]]
        if self.kind == "causal":
            return ids, len(ids) - 1
        return ids, ids.index(tokenizer.mask_token_id)

    def collate(
        self, examples: EncodedExamples, indices: Indices, length: int | None = None
    ) -> Batch:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return collate_examples(examples, indices, pad, length)

    def label_logits(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """fp32 logits of the label words at each example's scored position, shape [B, K]."""
        if self.single_token:
            return score_label_logits(model, batch, self.label_token_ids)
        return score_candidates(model, batch, self.candidates)

    def per_example_loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        logits = self.label_logits(model, batch)
        return F.cross_entropy(logits, batch.labels.to(logits.device), reduction="none")

    def evaluate(
        self, model: torch.nn.Module, examples: EncodedExamples, batch_size: int
    ) -> dict[str, float]:
        return {"accuracy": self.accuracy(model, examples, batch_size)}

    def accuracy(self, model: torch.nn.Module, examples: EncodedExamples, batch_size: int) -> float:
        correct = sum(self.example_scores(model, examples, batch_size)["accuracy"])
        return correct / max(len(examples), 1)

    def example_scores(
        self, model: torch.nn.Module, examples: EncodedExamples, batch_size: int
    ) -> dict[str, list[float]]:
        """Each example's score in [0, 1] per metric (1.0 if its label is predicted, else 0.0):
        what a noised sum over a private split adds up."""
        correct: list[float] = []
        for start in range(0, len(examples), batch_size):
            indices = range(start, min(start + batch_size, len(examples)))
            batch = self.collate(examples, indices)
            predictions = self.label_logits(model, batch).argmax(dim=-1).cpu()
            correct.extend(float(hit) for hit in (predictions == batch.labels).tolist())
        return {"accuracy": correct}


def _max_length(config: TaskConfig, position_limit: int | None) -> int | None:
    if config.max_length is None:
        return position_limit
    if position_limit is not None and config.max_length > position_limit:
        raise ConfigError(
            f"task.max_length={config.max_length} exceeds the {position_limit} positions this "
            f"model takes; allowed: 4..{position_limit} (or null for the model's limit)"
        )
    return config.max_length


def invalid_row_reason(row: Row, config: TaskConfig) -> str | None:
    """Why a row cannot be used (a missing or empty text field, a bad label), or None."""
    assert config.template is not None and config.label_words is not None, "resolve the task"
    for field in template_fields(config.template):
        text = row.get(field)
        if not isinstance(text, str) or not text.strip():
            return f"field {field!r} (read by task.template) is missing or empty"
    label_field = config.label_field or "label"
    if label_field not in row:
        return (
            f"no field {label_field!r} (task.label_field) for its label; the row has {sorted(row)}"
        )
    label = row.get(label_field)
    if label_index(label, config.label_words) is None:
        return (
            f"{label_field}={label!r} (task.label_field) must be a label word of "
            f"{config.label_words} or its index in [0, {len(config.label_words)})"
        )
    return None


def label_index(label: Any, label_words: Sequence[str]) -> int | None:
    """A row's label as an index into ``label_words``: the index itself, or the word (files
    often hold ``great`` rather than ``1``); None for anything else. A CSV column mixing words
    and indices is read as text, so an index may come as its digits."""
    if isinstance(label, str):
        word = label.strip()
        if word in label_words:
            return list(label_words).index(word)
        label = int(word) if word.isdecimal() else None
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
        return None
    return int(label) if 0 <= label < len(label_words) else None


def score_label_logits(
    model: torch.nn.Module, batch: Batch, label_token_ids: torch.Tensor
) -> torch.Tensor:
    """fp32 logits of ``label_token_ids`` at each example's scored position, shape [B, K].

    One forward pass scores every candidate; logits are cast to fp32 before any loss is formed,
    so loss differences are fp32 even when the model runs in half precision.
    """
    device = model_device(model)
    input_ids = batch.input_ids.to(device)
    attention_mask = batch.attention_mask.to(device)
    positions = batch.positions.to(device)
    rows = torch.arange(len(positions), device=device)
    scored = logits_at(model, input_ids, attention_mask, rows, positions, fp32=False)
    return scored[:, label_token_ids.to(device)].float()


def score_candidates(
    model: torch.nn.Module, batch: Batch, candidates: list[list[int]]
) -> torch.Tensor:
    """Length-normalised log-probability of each multi-token candidate after each prompt, [B, K].

    All B × K (prompt + candidate) sequences go through one batched forward; a candidate's
    score is the mean log-probability of its tokens, so longer words are not penalised.
    """
    device = model_device(model)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    sequences, targets = [], []
    for row, length in enumerate(lengths):
        prompt = batch.input_ids[row, :length].tolist()
        for tokens in candidates:
            sequences.append(prompt + tokens)
            # positions whose next-token prediction is a candidate token
            targets.append([(length - 1 + j, token) for j, token in enumerate(tokens)])
    # the batch's width plus the longest candidate: a function of the batch's shape alone, so
    # a batch of a public shape (task.pad_to='max_length') keeps one here too
    width = batch.input_ids.shape[1] + max(len(tokens) for tokens in candidates)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for index, sequence in enumerate(sequences):
        input_ids[index, : len(sequence)] = torch.tensor(sequence)
        attention_mask[index, : len(sequence)] = 1
    with scoring_mode():
        logits = model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            **no_cache(model),
        ).logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    scores = torch.stack(
        [
            torch.stack([log_probs[index, position, token] for position, token in target]).mean()
            for index, target in enumerate(targets)
        ]
    )
    return scores.view(len(lengths), len(candidates))


def sample_examples(
    rows: Sequence[Row], label_field: str, per_class: int | None, salt: str
) -> list[Row]:
    """k examples of every class (all rows when ``per_class`` is None), in salted-hash order.

    Each class keeps its k rows of lowest salted content hash (``privzo.tasks.data``), so one
    added record changes the selection by at most the one it displaces. A class with fewer than
    k rows contributes all of them, as the LM-BFF sampler the papers use does (TREC's smallest
    class has 86 training rows against k = 512).
    """
    order = hash_order(rows, salt)
    if per_class is None:
        return [rows[i] for i in order]
    taken: dict[Any, int] = {}
    chosen = []
    for index in order:  # hash order across classes: each class's lowest-hash k
        label = rows[index][label_field]
        if taken.get(label, 0) < per_class:
            taken[label] = taken.get(label, 0) + 1
            chosen.append(index)
    return [rows[i] for i in chosen]
