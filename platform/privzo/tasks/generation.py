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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from privzo.config.tasks import template_fields
from privzo.section import ConfigError
from privzo.tasks.classification import body_and_head, no_cache, scoring_mode
from privzo.tasks.data import Row
from privzo.tasks.interface import Indices
from privzo.tasks.metrics import exact_match, f1_score, mean_exact_match, mean_f1

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
        self.stop_token_ids = _stop_token_ids(tokenizer)

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
        device = _device(model)
        input_ids = batch.input_ids.to(device)
        predicts_target = batch.loss_mask[:, 1:].to(device).bool()
        rows, cols = predicts_target.nonzero(as_tuple=True)  # position cols predicts cols + 1
        logits = _logits_at(model, input_ids, batch.attention_mask.to(device), rows, cols)
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
        predictions: list[str] = []
        for start in range(0, len(examples), batch_size):
            prompts = [
                self._prompt_for_generation(examples.prompt_ids[i])
                for i in range(start, min(start + batch_size, len(examples)))
            ]
            predictions.extend(self._answer_text(ids) for ids in self._generate(model, prompts))
        return predictions

    def _prompt_for_generation(self, prompt_ids: list[int]) -> list[int]:
        """Leave room for ``max_new_tokens`` within ``max_length`` (as MeZO does)."""
        if self.max_length is None:
            return prompt_ids
        return self._left_truncate(prompt_ids, self.max_length - self.max_new_tokens)

    def _generate(self, model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
        """New token ids per prompt. HF models use ``generate`` (with its KV cache); a scoring
        view without it (privzo's prefix-tuning view) gets a cache-free greedy loop."""
        can_generate = getattr(model, "can_generate", None)
        generate = getattr(model, "generate", None)
        if callable(can_generate) and can_generate() and callable(generate):
            return self._generate_with_hf(generate, _device(model), prompts)
        return self._generate_by_loop(model, prompts)

    def _generate_with_hf(
        self,
        generate: Callable[..., torch.Tensor],
        device: torch.device,
        prompts: list[list[int]],
    ) -> list[list[int]]:
        """Left padding, so that every row's next token is read at the last column; ``generate``
        is the model's Hugging Face ``generate``."""
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        with torch.inference_mode():
            output = generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                do_sample=False,
                num_beams=1,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=list(self.stop_token_ids) or None,
                pad_token_id=self.pad_token_id,
            )
        return output[:, width:].tolist()

    def _generate_by_loop(
        self, model: torch.nn.Module, prompts: list[list[int]]
    ) -> list[list[int]]:
        """Greedy decoding by full forwards over a right-padded buffer: no cache, so it works
        with any module that scores like the training loss does, at the cost of recomputation."""
        device = _device(model)
        lengths = torch.tensor([len(ids) for ids in prompts], device=device)
        width = int(lengths.max()) + self.max_new_tokens
        input_ids = torch.full((len(prompts), width), self.pad_token_id, device=device)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, device=device)
        rows = torch.arange(len(prompts), device=device)
        active = torch.ones(len(prompts), dtype=torch.bool, device=device)
        stops = torch.tensor(self.stop_token_ids, dtype=torch.long, device=device)
        for _ in range(self.max_new_tokens):
            end = int(lengths.max())
            attention_mask = (torch.arange(end, device=device) < lengths[:, None]).long()
            logits = _logits_at(model, input_ids[:, :end], attention_mask, rows, lengths - 1)
            next_ids = logits.argmax(dim=-1)
            input_ids[rows[active], lengths[active]] = next_ids[active]
            lengths = lengths + active.long()
            active = active & ~torch.isin(next_ids, stops)
            if not active.any():
                break
        return [
            input_ids[row, len(prompt) : int(lengths[row])].tolist()
            for row, prompt in enumerate(prompts)
        ]

    def _answer_text(self, new_ids: list[int]) -> str:
        """Cut at the first stop token, decode, and keep the first line (a newline can also sit
        inside a token that is not a stop token)."""
        stops = set(self.stop_token_ids)
        end = next((i for i, token in enumerate(new_ids) if token in stops), len(new_ids))
        text = str(self.tokenizer.decode(new_ids[:end], skip_special_tokens=True))
        return text.split("\n", 1)[0].strip()


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


def _stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """EOS and the tokens a newline encodes to: answers end at the end of their line."""
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    for text in ("\n", "\n\n"):
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            if "\n" in tokenizer.decode([token_id]):
                ids.add(int(token_id))
    return tuple(sorted(ids))


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _logits_at(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
) -> torch.Tensor:
    """fp32 vocabulary logits at the positions (rows[i], cols[i]), shape [N, V], from one
    forward pass; the vocabulary projection runs only there when the model exposes its head,
    which for a long passage and a short answer is most of the logits' memory."""
    split = body_and_head(model)
    with scoring_mode():
        if split is None:
            logits = model(
                input_ids=input_ids, attention_mask=attention_mask, **no_cache(model)
            ).logits
            return logits[rows, cols].float()
        body, head = split
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, **no_cache(model))[0]
        return head(hidden[rows, cols]).float()


__all__ = [
    "DROP_TEMPLATE",
    "SQUAD_TEMPLATE",
    "GenerationBatch",
    "GenerationExamples",
    "GenerationTask",
]
