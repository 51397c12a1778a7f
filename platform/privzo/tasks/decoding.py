"""Greedy decoding of a generation task's answers after its prompts: Hugging Face ``generate``
where the model has it, a cache-free loop of scoring forwards where it does not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from privzo.tasks.scoring import logits_at, model_device


@dataclass(frozen=True)
class GreedyDecoder:
    """Greedy new tokens after each prompt, up to ``max_new_tokens`` or a stop token."""

    pad_token_id: int
    stop_token_ids: tuple[int, ...]
    max_new_tokens: int

    def generate(self, model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
        """New token ids per prompt. HF models use ``generate`` (with its KV cache); a scoring
        view without it (privzo's prefix-tuning view) gets a cache-free greedy loop."""
        can_generate = getattr(model, "can_generate", None)
        generate = getattr(model, "generate", None)
        if callable(can_generate) and can_generate() and callable(generate):
            return self._with_hf(generate, model_device(model), prompts)
        return self._by_loop(model, prompts)

    def _with_hf(
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

    def _by_loop(self, model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy decoding by full forwards over a right-padded buffer: no cache, so it works
        with any module that scores like the training loss does, at the cost of recomputation."""
        device = model_device(model)
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
            logits = logits_at(model, input_ids[:, :end], attention_mask, rows, lengths - 1)
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


def answer_text(
    tokenizer: PreTrainedTokenizerBase, new_ids: list[int], stop_token_ids: Sequence[int]
) -> str:
    """Cut at the first stop token, decode, and keep the first line (a newline can also sit
    inside a token that is not a stop token)."""
    stops = set(stop_token_ids)
    end = next((i for i, token in enumerate(new_ids) if token in stops), len(new_ids))
    text = str(tokenizer.decode(new_ids[:end], skip_special_tokens=True))
    return text.split("\n", 1)[0].strip()


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """EOS and the tokens a newline encodes to: answers end at the end of their line."""
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    for text in ("\n", "\n\n"):
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            if "\n" in tokenizer.decode([token_id]):
                ids.add(int(token_id))
    return tuple(sorted(ids))
