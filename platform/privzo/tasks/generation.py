"""Generation tasks for causal LMs (SQuAD, DROP as in MeZO): trained on the answer's LM loss,
scored by exact match and F1 of greedy answers.

Each row becomes a prompt such as ``"Title: ...\\nContext: ...\\nQuestion: ...\\nAnswer:"`` and a
target ``" " + answer``. Training minimises the mean negative log-likelihood of the target tokens
given the prompt (per example, so that each example's loss can be clipped for DP); evaluation
decodes greedily after the prompt and compares the first line with every reference answer.

The interface mirrors ``PromptClassificationTask`` (``encode`` → ``collate`` →
``per_example_loss``; ``evaluate`` → metrics; ``metric`` names the primary one), so the run loop
can drive either task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from privzo.config.tasks import template_fields
from privzo.section import ConfigError
from privzo.tasks.data import Row
from privzo.tasks.decoding import GreedyDecoder, answer_text, stop_token_ids
from privzo.tasks.interface import Indices
from privzo.tasks.metrics import exact_match, f1_score, mean_exact_match, mean_f1
from privzo.tasks.scoring import logits_at, model_device

SQUAD_TEMPLATE = "Title: {title}\nContext: {context}\nQuestion: {question}\nAnswer:"
DROP_TEMPLATE = "Passage: {context}\nQuestion: {question}\nAnswer:"


@dataclass
class GenerationExamples:
    """Tokenised prompts and training targets, plus the reference answers evaluation needs.

    The prompt's raw text is not kept; the references are, since the metrics compare text.
    """

    prompt_ids: list[list[int]]
    target_ids: list[list[int]]
    references: list[list[str]]
    # each prompt's tokens cut off its start to fit max_length beside its target (empty: none
    # counted), so a run can say when a limit cuts most of the passage away
    cut_tokens: list[int] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class GenerationBatch:
    """Right-padded prompt + target ids; ``loss_mask`` is 1 exactly on the target tokens."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


class GenerationTask:
    """Encodes question-answering rows for a causal LM, scores answers, and decodes greedily."""

    metric = "f1"
    metrics = ("exact_match", "f1")

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        template: str,
        answer_field: str,
        max_length: int | None,
        max_new_tokens: int = 32,
        answer_suffix: str = "",
    ) -> None:
        """``max_length`` bounds prompt + answer in training and prompt + generated tokens in
        evaluation (pass the model's position limit, or less); None means no truncation."""
        self.tokenizer = tokenizer
        self.template = template
        # MeZO trains on "answer\n": the newline teaches where an answer ends (decoding stops
        # there); the presets pass "\n".
        self.answer_suffix = answer_suffix
        self.fields = _template_fields(template)
        self.answer_field = answer_field
        self.max_length = max_length
        self.max_new_tokens = max_new_tokens
        self._check_settings()
        self.pad_token_id = _pad_token_id(tokenizer)
        self.stop_token_ids = stop_token_ids(tokenizer)

    def _check_settings(self) -> None:
        if self.answer_field in self.fields:
            raise ConfigError(
                f"template {self.template!r} reads the answer field {self.answer_field!r}: the "
                "prompt would contain the answer"
            )
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.max_length is not None and self.max_new_tokens >= self.max_length:
            raise ConfigError(
                f"max_new_tokens={self.max_new_tokens} leaves no room for the prompt within "
                f"max_length={self.max_length}; allowed: 1..{self.max_length - 1}"
            )

    # ----------------------------------------------------------------------------- rows

    def invalid_row_reason(self, row: Row) -> str | None:
        """Why a row cannot be used (a missing or empty field, no usable answer), or None."""
        return generation_row_reason(row, self.fields, self.answer_field)

    def check_rows(self, rows: Sequence[Row], source: str) -> None:
        """Reject the first unusable row, naming the source, the row index and the field."""
        for index, row in enumerate(rows):
            reason = self.invalid_row_reason(row)
            if reason is not None:
                raise ConfigError(f"{source} row {index}: {reason}")

    def format_prompt(self, row: Row) -> str:
        """The template filled with the row's fields, stripped so stray whitespace in the data
        cannot change the prompt's layout."""
        return self.template.format(**{field: row[field].strip() for field in self.fields})

    # ----------------------------------------------------------------------------- encoding

    def encode(self, rows: Sequence[Row]) -> GenerationExamples:
        """Tokenise every row; the first answer is the training target, all are references."""
        prompts, targets, references, cut = [], [], [], []
        for index, row in enumerate(rows):
            answers = [str(answer) for answer in row[self.answer_field]]
            prompt_ids, target_ids = self._tokenize(self.format_prompt(row), answers[0])
            if not target_ids:
                raise ConfigError(f"row {index}: answer {answers[0]!r} encodes to no tokens")
            prompts.append(self._fit_for_training(prompt_ids, len(target_ids), index))
            targets.append(target_ids)
            references.append(answers)
            cut.append(len(prompt_ids) - len(prompts[-1]))
        return GenerationExamples(prompts, targets, references, cut)

    def public_example(self) -> GenerationExamples:
        """One example built from the template alone (empty fields, answer "yes"): a forward
        input that holds no record, for ranks that must join a collective forward with no
        batch."""
        prompt_ids, target_ids = self._tokenize(
            self.format_prompt(dict.fromkeys(self.fields, "")), "yes"
        )
        return GenerationExamples([prompt_ids], [target_ids], [["yes"]])

    def _tokenize(self, prompt: str, answer: str) -> tuple[list[int], list[int]]:
        """Prompt ids (BOS first, if the tokenizer has one) and ids of ``" " + answer + suffix``.

        The target is cut from the tokenisation of prompt + target, so its ids are those the
        model sees after this prompt (a SentencePiece tokenizer encodes a lone " answer" with an
        extra word-start token); if the prompt's tokens change when the target is appended, the
        target is encoded on its own instead.
        """
        encode = self.tokenizer.encode
        prompt_ids = encode(prompt, add_special_tokens=False)
        target = " " + answer.strip() + self.answer_suffix
        full_ids = encode(prompt + target, add_special_tokens=False)
        if full_ids[: len(prompt_ids)] == prompt_ids:
            target_ids = full_ids[len(prompt_ids) :]
        else:
            target_ids = encode(target, add_special_tokens=False)
        if self.tokenizer.bos_token_id is not None:
            prompt_ids = [self.tokenizer.bos_token_id, *prompt_ids]
        return prompt_ids, target_ids

    def _fit_for_training(self, prompt_ids: list[int], target_length: int, index: int) -> list[int]:
        if self.max_length is None:
            return prompt_ids
        budget = self.max_length - target_length
        if budget < 1:
            raise ConfigError(
                f"row {index}: the answer is {target_length} tokens, leaving no room for the "
                f"prompt within max_length={self.max_length}; raise max_length or drop the row"
            )
        return self._left_truncate(prompt_ids, budget)

    def _left_truncate(self, prompt_ids: list[int], budget: int) -> list[int]:
        """At most ``budget`` tokens: BOS and the prompt's end (the question and "Answer:") are
        kept, and the start of the passage is dropped, as in MeZO."""
        if len(prompt_ids) <= budget:
            return prompt_ids
        head = 1 if self.tokenizer.bos_token_id is not None else 0
        return prompt_ids[:head] + prompt_ids[len(prompt_ids) - (budget - head) :]

    def collate(
        self, examples: GenerationExamples, indices: Indices, length: int | None = None
    ) -> GenerationBatch:
        """Right padding (to ``length``, or the longest sequence): every real token keeps the
        position it has in an unpadded forward."""
        sequences = [examples.prompt_ids[i] + examples.target_ids[i] for i in indices]
        width = length if length is not None else max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        loss_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, (index, ids) in enumerate(zip(indices, sequences, strict=True)):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
            loss_mask[row, len(examples.prompt_ids[index]) : len(ids)] = 1
        return GenerationBatch(input_ids, attention_mask, loss_mask)

    # ----------------------------------------------------------------------------- loss

    def per_example_loss(self, model: torch.nn.Module, batch: GenerationBatch) -> torch.Tensor:
        """Mean NLL of each example's answer tokens, fp32, shape [B].

        Per example, as the private estimators clip one loss difference per example (MeZO's
        reference code averages over all answer tokens of the batch instead); a mean rather than
        a sum keeps long answers on the same scale as short ones.
        """
        device = model_device(model)
        input_ids = batch.input_ids.to(device)
        predicts_target = batch.loss_mask[:, 1:].to(device).bool()
        rows, cols = predicts_target.nonzero(as_tuple=True)  # position cols predicts cols + 1
        logits = logits_at(model, input_ids, batch.attention_mask.to(device), rows, cols)
        nll = F.cross_entropy(logits, input_ids[rows, cols + 1], reduction="none")
        totals = torch.zeros(len(batch), dtype=torch.float32, device=device)
        totals.index_add_(0, rows, nll)
        return totals / predicts_target.sum(dim=1).clamp(min=1)

    # ----------------------------------------------------------------------------- decoding

    def evaluate(
        self, model: torch.nn.Module, examples: GenerationExamples, batch_size: int
    ) -> dict[str, float]:
        """Mean exact match and F1 (SQuAD normalization) of greedy answers over ``examples``."""
        predictions = self.predict(model, examples, batch_size)
        return {
            "exact_match": mean_exact_match(predictions, examples.references),
            "f1": mean_f1(predictions, examples.references),
        }

    def example_scores(
        self, model: torch.nn.Module, examples: GenerationExamples, batch_size: int
    ) -> dict[str, list[float]]:
        """Each example's exact match and F1, each in [0, 1]: what a noised sum adds up."""
        predictions = self.predict(model, examples, batch_size)
        return {
            "exact_match": list(map(exact_match, predictions, examples.references)),
            "f1": list(map(f1_score, predictions, examples.references)),
        }

    def predict(
        self, model: torch.nn.Module, examples: GenerationExamples, batch_size: int
    ) -> list[str]:
        """Greedy answers: the new tokens up to EOS or a newline, decoded, first line only."""
        decoder = GreedyDecoder(self.pad_token_id, self.stop_token_ids, self.max_new_tokens)
        predictions: list[str] = []
        for start in range(0, len(examples), batch_size):
            prompts = [
                self._prompt_for_generation(examples.prompt_ids[i])
                for i in range(start, min(start + batch_size, len(examples)))
            ]
            new_ids = decoder.generate(model, prompts)
            predictions.extend(
                answer_text(self.tokenizer, ids, self.stop_token_ids) for ids in new_ids
            )
        return predictions

    def _prompt_for_generation(self, prompt_ids: list[int]) -> list[int]:
        """Leave room for ``max_new_tokens`` within ``max_length`` (as MeZO does)."""
        if self.max_length is None:
            return prompt_ids
        return self._left_truncate(prompt_ids, self.max_length - self.max_new_tokens)


def generation_row_reason(row: Row, fields: Sequence[str], answer_field: str) -> str | None:
    """Why a row cannot be used (a missing or empty field, no usable answer), or None.

    Needs no tokenizer, so rows are checked before any model is loaded.
    """
    for field in fields:
        text = row.get(field)
        if not isinstance(text, str) or not text.strip():
            return f"field {field!r} (read by the template) is missing or empty"
    answers = row.get(answer_field)
    if isinstance(answers, str) or not isinstance(answers, Sequence):
        return (
            f"field {answer_field!r} must be a list of reference answer strings, "
            f"not {type(answers).__name__}"
        )
    if len(answers) == 0:
        return f"field {answer_field!r} is an empty list: no reference answer"
    if not all(isinstance(answer, str) and answer.strip() for answer in answers):
        return f"field {answer_field!r} holds an empty or non-string answer"
    return None


def _template_fields(template: str) -> tuple[str, ...]:
    """The row fields a template reads, as a ConfigError when the template is unusable."""
    try:
        fields = template_fields(template)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if not fields:
        raise ConfigError(f"template {template!r} reads no field: nothing of the row is shown")
    return tuple(fields)


def _pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The pad id, else EOS (decoder-only tokenizers often have no pad), else 0; padding is
    masked out everywhere, so only its being a valid id matters."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


__all__ = [
    "DROP_TEMPLATE",
    "SQUAD_TEMPLATE",
    "GenerationBatch",
    "GenerationExamples",
    "GenerationTask",
]
