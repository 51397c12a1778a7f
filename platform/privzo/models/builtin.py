"""Built-in models that need no download: the offline default of the demo and the tests.

Each built-in is a *recipe* (architecture, sizes, and for the demo models a short first-order
pretraining run on the public synthetic corpus of ``privzo.demo_data``); all share one byte-level
BPE tokenizer trained on that corpus. ``materialize_builtin``
turns a recipe into an ordinary Hugging Face directory (model + tokenizer), so everything
downstream loads built-ins exactly like hub checkpoints, with ``from_pretrained``.

The directory name carries a hash of the recipe, so changing a recipe never serves a stale
cache, and it is written to a temporary directory and renamed, so an interrupted build never
leaves a half-written cache behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    OPTConfig,
    OPTForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
)

from privzo import demo_data
from privzo.dirlock import waited_lock

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
# Bump when the build code changes in a way the recipe fields do not capture.
BUILD_FORMAT = 2
MAX_POSITIONS = 128
# The tokenizer's training text: this many public sentences (seed 0). Its merges stop well below
# the cap (every word one token), which only guards against an unbounded vocabulary.
TOKENIZER_CORPUS_SENTENCES = 20_000
MAX_BPE_VOCABULARY = 2048


@dataclass(frozen=True)
class PretrainRecipe:
    """A short, seeded first-order causal-LM pretraining run on the public corpus."""

    corpus_sentences: int = 20_000
    corpus_seed: int = 0
    steps: int = 800
    batch_size: int = 64
    learning_rate: float = 6e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    seed: int = 0


@dataclass(frozen=True)
class BuiltinRecipe:
    """Architecture and size of one built-in model, and how (if at all) it is pretrained."""

    arch: Literal["opt", "roberta"]
    hidden: int
    layers: int
    heads: int
    ffn: int
    pretrain: PretrainRecipe | None = None
    init_seed: int = 0
    # Demo models start from a wider init: it shortens the plateau before the sentiment
    # structure of the corpus is picked up several-fold (measured: ~400 vs ~800 steps).
    init_std: float = 0.02

    def version(self) -> str:
        """A short hash of everything that determines the built files."""
        payload = {
            "recipe": asdict(self),
            "vocab": tokenizer_words(),
            "tokenizer": TOKENIZER_CORPUS_SENTENCES,
            "fmt": BUILD_FORMAT,
            # A corpus sample catches generator edits that a version bump might miss; every
            # built-in's tokenizer is trained on the corpus.
            "corpus": demo_data.public_corpus(64, 0),
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


# tiny-*: random init, for tests. demo-opt-*: pretrained once (800 AdamW steps, batch 64) and
# cached; 0.16M / 0.72M / 1.09M parameters.
BUILTIN_MODELS: dict[str, BuiltinRecipe] = {
    "tiny-opt": BuiltinRecipe("opt", hidden=32, layers=2, heads=4, ffn=64),
    "tiny-roberta": BuiltinRecipe("roberta", hidden=32, layers=2, heads=4, ffn=64),
    "demo-opt-s": BuiltinRecipe("opt", 64, 2, 4, 256, PretrainRecipe(), init_std=0.1),
    "demo-opt-m": BuiltinRecipe("opt", 128, 3, 4, 512, PretrainRecipe(), init_std=0.1),
    "demo-opt-l": BuiltinRecipe("opt", 160, 3, 4, 640, PretrainRecipe(), init_std=0.1),
}


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in model rather than a hub id or a path."""
    return name in BUILTIN_MODELS


def build_tokenizer(
    *, append_eos: bool = False, size: int | None = None
) -> PreTrainedTokenizerFast:
    """privzo's byte-level BPE tokenizer: any text encodes, none of it to ``<unk>``.

    Its merges are those of :func:`public_bpe`; ``size`` pads the vocabulary with reserved
    tokens (``<reserved_N>``, which no text encodes to) so that its length is an embedding's
    row count. Causal models get ``<s> text`` (no trailing ``</s>``, so the last prompt token is
    the one scored); masked models get ``<s> text </s>`` as RoBERTa expects.
    """
    core = Tokenizer.from_str(_pad_vocabulary(public_bpe(), size))
    mask = AddedToken("<mask>", lstrip=True, special=True, normalized=False)
    return wrap_tokenizer(core, append_eos=append_eos, mask_token=mask)


def wrap_tokenizer(
    core: Tokenizer, *, append_eos: bool, mask_token: str | AddedToken = "<mask>"
) -> PreTrainedTokenizerFast:
    """``core`` (whose vocabulary holds ``SPECIAL_TOKENS``) as a transformers tokenizer with
    privzo's special tokens: ``<s> text`` for causal models, ``<s> text </s>`` for masked ones."""
    ids = {token: core.token_to_id(token) for token in ("<s>", "</s>")}
    single = "<s> $A </s>" if append_eos else "<s> $A"
    pair = "<s> $A </s> $B:1 </s>:1" if append_eos else "<s> $A $B:1"
    core.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(ids.items())
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token=mask_token,
        model_max_length=MAX_POSITIONS,
    )


def tokenizer_words() -> list[str]:
    """Public words that must be single tokens: the demo generator's and the task presets' label
    words (so a masked LM's one slot holds each)."""
    from privzo.tasks.presets import PRESETS

    label_words = (w for p in PRESETS.values() for ws in p.label_words.values() for w in ws)
    return list(dict.fromkeys([*demo_data.vocabulary(), *(w.lower() for w in label_words)]))


@functools.cache
def public_bpe() -> str:
    """The byte-level BPE (serialised) trained on the public corpus and :func:`tokenizer_words`.

    Merges run until every word of both is one token, so demo prompts are as many tokens as
    words; training is deterministic. Text is lowercased first, as the corpus is: the built-in
    models know lowercase words only.
    """
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_BPE_VOCABULARY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = demo_data.public_corpus(TOKENIZER_CORPUS_SENTENCES, seed=0)
    core.train_from_iterator([*texts, " ".join(tokenizer_words())], trainer)
    state = json.loads(core.to_str())
    for token in state["added_tokens"]:
        # RoBERTa's convention: "was <mask>" puts the mask right after "Ġwas", not after "Ġ".
        token["lstrip"] = token["content"] == "<mask>"
    return json.dumps(state)


def _pad_vocabulary(serialised: str, size: int | None) -> str:
    """``serialised`` with reserved tokens appended to its BPE vocabulary up to ``size``."""
    if size is None:
        return serialised
    state = json.loads(serialised)
    vocab: dict[str, int] = state["model"]["vocab"]
    if size < len(vocab):
        raise ValueError(
            f"a vocabulary of {size} rows is smaller than privzo's tokenizer ({len(vocab)} tokens)"
        )
    vocab.update({f"<reserved_{i}>": i for i in range(len(vocab), size)})
    return json.dumps(state)


def _build_model(recipe: BuiltinRecipe, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised model (seeded, without touching the global RNG)."""
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.init_seed)
        if recipe.arch == "opt":
            opt_config = OPTConfig(
                hidden_size=recipe.hidden,
                word_embed_proj_dim=recipe.hidden,
                num_hidden_layers=recipe.layers,
                num_attention_heads=recipe.heads,
                ffn_dim=recipe.ffn,
                max_position_embeddings=MAX_POSITIONS,
                dropout=0.0,
                attention_dropout=0.0,
                init_std=recipe.init_std,
                **ids,
            )
            return OPTForCausalLM(opt_config)
        roberta_config = RobertaConfig(
            hidden_size=recipe.hidden,
            num_hidden_layers=recipe.layers,
            num_attention_heads=recipe.heads,
            intermediate_size=recipe.ffn,
            max_position_embeddings=MAX_POSITIONS + 2,  # RoBERTa offsets positions by pad+1
            type_vocab_size=1,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            initializer_range=recipe.init_std,
            **ids,
        )
        return RobertaForMaskedLM(roberta_config)


def _corpus_tensor(tokenizer: PreTrainedTokenizerFast, sentences: Sequence[str]) -> torch.Tensor:
    """``<s> sentence </s>`` per row, right-padded with the pad id."""
    rows = [[*ids, tokenizer.eos_token_id] for ids in tokenizer(list(sentences))["input_ids"]]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _lr_factor(step: int, recipe: PretrainRecipe) -> float:
    """Linear warm-up then linear decay to zero: stable and short."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    return max(0.0, (recipe.steps - step) / max(1, recipe.steps - recipe.warmup_steps))


def _next_token_loss(
    model: PreTrainedModel, batch: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The causal-LM loss with the output layer applied to real tokens only: with a byte-level
    vocabulary that layer is a large share of the step, and a third of the rows are padding."""
    hidden = model.base_model(input_ids=batch, attention_mask=mask.long()).last_hidden_state
    targets = mask[:, 1:]
    logits = model.get_output_embeddings()(hidden[:, :-1][targets])
    return F.cross_entropy(logits.float(), batch[:, 1:][targets])


def pretrain(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    recipe: PretrainRecipe,
    progress: bool = True,
) -> list[float]:
    """Seeded AdamW causal-LM pretraining on the public corpus; returns the loss per step."""
    data = _corpus_tensor(
        tokenizer, demo_data.public_corpus(recipe.corpus_sentences, recipe.corpus_seed)
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, recipe))
    model.train()
    losses: list[float] = []
    start, every = time.perf_counter(), max(1, recipe.steps // 10)
    for step in range(recipe.steps):
        batch = data[torch.randint(len(data), (recipe.batch_size,), generator=generator)]
        loss = _next_token_loss(model, batch, batch.ne(tokenizer.pad_token_id))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if progress and (step % every == 0 or step == recipe.steps - 1):
            elapsed = time.perf_counter() - start
            print(
                f"[privzo] pretraining step {step + 1}/{recipe.steps} "
                f"loss {loss.item():.3f} ({elapsed:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
    model.eval()
    return losses


def _build(name: str, recipe: BuiltinRecipe, target: Path, progress: bool) -> None:
    """Build the model and tokenizer of ``recipe`` and save both to ``target``."""
    tokenizer = build_tokenizer(append_eos=recipe.arch == "roberta")
    model = _build_model(recipe, tokenizer)
    losses: list[float] = []
    if recipe.pretrain is not None:
        if progress:
            print(f"[privzo] building built-in model {name!r} (one-off)", file=sys.stderr)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.pretrain.seed)
            losses = pretrain(model, tokenizer, recipe.pretrain, progress)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    # the pretraining losses say how the weights were made, beside the recipe that made them
    info = {
        "name": name,
        "version": recipe.version(),
        "recipe": asdict(recipe),
        "pretrain_losses": losses,
    }
    (target / "privzo_builtin.json").write_text(json.dumps(info, indent=2))


def materialize_builtin(name: str, cache_dir: str | Path, progress: bool = True) -> Path:
    """The HF-format directory of built-in ``name`` under ``cache_dir``, building it once.

    Later calls (from any process) reuse ``cache_dir/<name>-<recipe hash>/``.
    """
    if name not in BUILTIN_MODELS:
        raise KeyError(f"unknown built-in model {name!r}; known: {sorted(BUILTIN_MODELS)}")
    recipe = BUILTIN_MODELS[name]
    cache_dir = Path(cache_dir)
    final = cache_dir / f"{name}-{recipe.version()}"
    if (final / "privzo_builtin.json").is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Trials, workers and test processes that share a cold cache wait for one build instead
    # of each building the model; the lock goes with its holder, however that process ends.
    with waited_lock(cache_dir / f".{final.name}.lock"):
        if (final / "privzo_builtin.json").is_file():
            return final
        _build_into(name, recipe, cache_dir, final, progress)
    return final


def _build_into(
    name: str, recipe: BuiltinRecipe, cache_dir: Path, final: Path, progress: bool
) -> None:
    """Build in a staging directory and rename it to ``final``: a reader never sees half a
    model, and a build killed midway leaves only its staging directory."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
    staging.chmod(0o755)  # mkdtemp's 0700 would make a shared cache unreadable to others
    try:
        _build(name, recipe, staging, progress)
        try:
            os.rename(staging, final)
        except OSError:
            if not (final / "privzo_builtin.json").is_file():  # not a concurrent winner
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
