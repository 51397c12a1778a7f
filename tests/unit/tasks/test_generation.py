"""Generation tasks (SQuAD / DROP): prompts, loss mask, answer loss, greedy decoding, EM / F1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from privzo.config import ConfigError
from privzo.models.builtin import materialize_builtin
from privzo.tasks.generation import DROP_TEMPLATE, SQUAD_TEMPLATE, GenerationTask
from word_tokenizer import build_word_tokenizer

SQUAD_ROW = {
    "title": "France",
    "context": "Paris is the capital of France.",
    "question": "  What is the capital of France? ",
    "answers": ["Paris", "the city of Paris"],
}
DROP_ROW = {
    "context": "Ben scored 3 goals and Mia scored 2.",
    "question": "How many goals did Ben score?",
    "answers": ["3", "three"],
}
# Every word of the rows and templates, so no golden test passes on <unk> tokens.
WORDS = " ".join(
    (
        "title context question answer passage france paris is the capital of what city ben",
        "scored 3 goals and mia 2 how many did score three rome . : ?",
    )
).split()


@pytest.fixture(scope="module")
def words() -> PreTrainedTokenizerBase:
    """A word-level tokenizer with a newline token, so prompt lines survive tokenisation."""
    tokenizer = build_word_tokenizer(WORDS)
    tokenizer.add_tokens(["\n"])
    return tokenizer


@pytest.fixture(scope="module")
def opt_dir(cache_dir: Path) -> Path:
    return materialize_builtin("tiny-opt", cache_dir, progress=False)


@pytest.fixture(scope="module")
def opt_tokenizer(opt_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(opt_dir)


def _opt_model(opt_dir: Path) -> torch.nn.Module:
    """A fresh copy, so tests that rewrite weights do not leak into each other."""
    return AutoModelForCausalLM.from_pretrained(opt_dir).eval()


def _squad(tokenizer: PreTrainedTokenizerBase, **options) -> GenerationTask:
    options = {"max_length": None, **options}
    return GenerationTask(tokenizer, template=SQUAD_TEMPLATE, answer_field="answers", **options)


def _film_rows(count: int) -> list[dict]:
    """Rows with passages of different lengths (tiny-opt vocabulary words)."""
    return [
        {
            "title": f"hotel {index}",
            "context": "the staff was lovely and the room was clean . " * (index + 1),
            "question": "what was the room ?" if index % 2 else "how was the staff ?",
            "answers": ["clean", "very clean"] if index % 2 else ["the staff was lovely"],
        }
        for index in range(count)
    ]


# ------------------------------------------------------------------------------------ prompts


def test_squad_prompt_golden_text_and_token_layout(words) -> None:
    task = _squad(words)
    prompt = task.format_prompt(SQUAD_ROW)
    assert prompt == (
        "Title: France\nContext: Paris is the capital of France.\n"
        "Question: What is the capital of France?\nAnswer:"
    )
    examples = task.encode([SQUAD_ROW])
    prompt_ids, target_ids = examples.prompt_ids[0], examples.target_ids[0]
    assert prompt_ids[0] == words.bos_token_id
    assert prompt_ids[1:] == words.encode(prompt, add_special_tokens=False)
    assert words.unk_token_id not in prompt_ids + target_ids
    assert words.decode(prompt_ids[1:]) == (
        "title : france \n context : paris is the capital of france . \n "
        "question : what is the capital of france ? \n answer :"
    )
    assert words.decode(target_ids) == "paris"
    assert examples.references == [["Paris", "the city of Paris"]]


def test_drop_prompt_golden_text_and_token_layout(words) -> None:
    task = GenerationTask(words, template=DROP_TEMPLATE, answer_field="answers", max_length=None)
    assert task.fields == ("context", "question")
    assert task.format_prompt(DROP_ROW) == (
        "Passage: Ben scored 3 goals and Mia scored 2.\n"
        "Question: How many goals did Ben score?\nAnswer:"
    )
    examples = task.encode([DROP_ROW])
    assert words.unk_token_id not in examples.prompt_ids[0]
    assert words.decode(examples.prompt_ids[0], skip_special_tokens=False) == (
        "<s> passage : ben scored 3 goals and mia scored 2 . \n "
        "question : how many goals did ben score ? \n answer :"
    )
    assert examples.target_ids == [words.encode(" 3", add_special_tokens=False)]


def test_loss_mask_covers_exactly_the_answer_tokens(words) -> None:
    long_answer = {**SQUAD_ROW, "question": "What city?", "answers": ["the city of Paris"]}
    task = _squad(words)
    examples = task.encode([SQUAD_ROW, long_answer])
    batch = task.collate(examples, [1, 0])
    assert len(batch) == 2
    for row, index in enumerate([1, 0]):
        prompt, target = examples.prompt_ids[index], examples.target_ids[index]
        length = len(prompt) + len(target)
        masked = batch.loss_mask[row].nonzero().flatten().tolist()
        assert masked == list(range(len(prompt), length))
        assert batch.input_ids[row, masked].tolist() == target
        assert batch.attention_mask[row].tolist() == [1] * length + [0] * (
            batch.input_ids.shape[1] - length
        )
    assert [len(t) for t in examples.target_ids] == [1, 4]


def test_truncation_drops_the_passage_start_never_the_answer(words) -> None:
    row = {**SQUAD_ROW, "context": "Paris is the capital of France. " * 20}
    full = _squad(words).encode([row])
    examples = _squad(words, max_length=20, max_new_tokens=4).encode([row])
    prompt, target = examples.prompt_ids[0], examples.target_ids[0]
    assert target == full.target_ids[0]
    assert len(prompt) + len(target) == 20
    assert prompt[0] == words.bos_token_id
    assert prompt[1:] == full.prompt_ids[0][-(19 - len(target)) :]
    assert words.decode(prompt[-4:]) == "? \n answer :"
    assert examples.cut_tokens == [len(full.prompt_ids[0]) - len(prompt)] and full.cut_tokens == [0]

    long_answer = {**SQUAD_ROW, "answers": ["the city of paris " * 5]}
    with pytest.raises(ConfigError, match=r"row 0: the answer is 20 tokens.*max_length=20"):
        _squad(words, max_length=20, max_new_tokens=4).encode([long_answer])


# ------------------------------------------------------------------------------------ loss


def test_per_example_loss_is_the_mean_answer_nll_of_an_unpadded_forward(
    opt_dir, opt_tokenizer
) -> None:
    model = _opt_model(opt_dir)
    task = _squad(opt_tokenizer)
    examples = task.encode(_film_rows(3))
    losses = task.per_example_loss(model, task.collate(examples, [0, 2, 1]))
    assert losses.dtype == torch.float32 and losses.shape == (3,)

    expected = []
    for index in (0, 2, 1):
        prompt, target = examples.prompt_ids[index], examples.target_ids[index]
        ids = torch.tensor([prompt + target])
        with torch.no_grad():
            log_probs = F.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        nll = [-log_probs[len(prompt) + k - 1, token] for k, token in enumerate(target)]
        expected.append(torch.stack(nll).mean())
    torch.testing.assert_close(losses, torch.stack(expected), rtol=1e-5, atol=1e-5)
    assert losses[0] != losses[1]  # different answers, different losses: not a constant


# ------------------------------------------------------------------------------------ decoding


def _reference_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int) -> str:
    """One example, no padding, a full forward per token: the plainest greedy decoder."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            next_id = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        if next_id == tokenizer.eos_token_id:
            break
        ids.append(next_id)
    return tokenizer.decode(ids[len(prompt) :], skip_special_tokens=True).strip()


class _ScorerOnly(torch.nn.Module):
    """Only the scoring interface (``base_model`` + ``lm_head``) without ``generate``, like
    privzo's prefix-tuning view: predictions must come from the task's own greedy loop."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.lm_head = model.lm_head

    @property
    def base_model(self) -> torch.nn.Module:
        return self.model.base_model


def test_batched_predictions_match_a_plain_greedy_loop(opt_dir, opt_tokenizer) -> None:
    model = _opt_model(opt_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # large random weights: outputs differ between prompts
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    task = _squad(opt_tokenizer, max_length=128, max_new_tokens=6)
    examples = task.encode(_film_rows(5))
    expected = [_reference_greedy(model, opt_tokenizer, p, 6) for p in examples.prompt_ids]
    assert len(set(expected)) > 1
    assert task.predict(model, examples, batch_size=3) == expected  # left-padded generate
    assert task.predict(_ScorerOnly(model), examples, batch_size=3) == expected  # loop


def _always_predict(model: torch.nn.Module, token_id: int) -> torch.nn.Module:
    """Make tiny-opt predict ``token_id`` after every input: the final layer norm outputs a
    constant unit vector that only ``token_id``'s (tied) output embedding points along."""
    with torch.no_grad():
        norm = model.model.decoder.final_layer_norm
        norm.weight.zero_()
        norm.bias.zero_()
        norm.bias[0] = 1.0
        embeddings = model.get_output_embeddings().weight
        embeddings[:, 0] = 0.0
        embeddings[token_id, 0] = 1.0
    return model


def test_known_greedy_output_gives_exact_metrics(opt_dir, opt_tokenizer) -> None:
    great = opt_tokenizer.convert_tokens_to_ids("Ġgreat")
    model = _always_predict(_opt_model(opt_dir), great)
    rows = _film_rows(2)
    rows[0]["answers"], rows[1]["answers"] = ["Great!"], ["lovely", "clean"]

    one = _squad(opt_tokenizer, max_new_tokens=1)
    examples = one.encode(rows)
    assert one.predict(model, examples, batch_size=2) == ["great", "great"]
    assert one.evaluate(model, examples, batch_size=1) == {"exact_match": 0.5, "f1": 0.5}

    three = _squad(opt_tokenizer, max_new_tokens=3)
    assert three.predict(model, examples, batch_size=2) == ["great great great"] * 2
    # "great great great" vs "great": precision 1/3, recall 1 → F1 0.5; vs the others 0.
    assert three.evaluate(model, examples, batch_size=2) == {"exact_match": 0.0, "f1": 0.25}


def _count_forwards(module: torch.nn.Module) -> list[int]:
    calls = [0]

    def count(*_: object) -> None:
        calls[0] += 1

    module.register_forward_hook(count)
    return calls


@pytest.mark.parametrize("stop", ["eos", "newline"])
def test_generation_stops_at_eos_and_newline(opt_dir, opt_tokenizer, stop) -> None:
    """A model whose first new token is a stop token yields "" after one forward per path."""
    tokenizer, model = opt_tokenizer, _opt_model(opt_dir)
    if stop == "newline":
        tokenizer = AutoTokenizer.from_pretrained(opt_dir)
        tokenizer.add_tokens(["\n"])
        model.resize_token_embeddings(len(tokenizer))
    stop_id = tokenizer.convert_tokens_to_ids("\n" if stop == "newline" else tokenizer.eos_token)
    _always_predict(model, stop_id)
    task = _squad(tokenizer, max_new_tokens=5)
    examples = task.encode(_film_rows(2))
    forwards = _count_forwards(model.model.decoder)
    assert task.predict(model, examples, batch_size=2) == ["", ""]  # generate
    assert task.predict(_ScorerOnly(model), examples, batch_size=2) == ["", ""]  # loop
    assert forwards[0] == 2  # not 2 x 5: neither path ran on to max_new_tokens


class _Bigram(torch.nn.Module):
    """A scorer whose next token is ``table[current token]`` (others score all zeros);
    ``calls`` counts its forward passes."""

    def __init__(self, table: dict[int, int], vocabulary: int) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.lm_head = torch.nn.Linear(vocabulary, vocabulary, bias=False)
        weight = torch.zeros(vocabulary, vocabulary)
        for current, following in table.items():
            weight[following, current] = 1.0
        self.lm_head.weight.data = weight
        self.body = _OneHot(vocabulary)

    @property
    def base_model(self) -> torch.nn.Module:
        return self.body

    @property
    def calls(self) -> int:
        return self.body.calls


class _OneHot(torch.nn.Module):
    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        self.calls += 1
        return (F.one_hot(input_ids, self.vocabulary).float(),)


def test_an_answer_ends_at_its_line(words) -> None:
    colon, paris, rome, newline = words.convert_tokens_to_ids([":", "paris", "rome", "\n"])
    task = _squad(words, max_new_tokens=4)
    assert newline in task.stop_token_ids and words.eos_token_id in task.stop_token_ids
    examples = task.encode([SQUAD_ROW])
    runs_on = _Bigram({colon: paris, paris: rome, rome: rome}, len(words))
    assert task.predict(runs_on, examples, batch_size=1) == ["paris rome rome rome"]
    assert runs_on.calls == 4
    breaks = _Bigram({colon: paris, paris: newline, newline: rome, rome: rome}, len(words))
    assert task.predict(breaks, examples, batch_size=1) == ["paris"]
    assert breaks.calls == 2  # stopped at the newline
    assert task.evaluate(breaks, examples, batch_size=1) == {"exact_match": 1.0, "f1": 1.0}


def test_a_newline_inside_a_token_also_ends_the_answer() -> None:
    """Byte-level BPE has tokens like ".\\n" that are not the newline token itself."""
    tokenizer = build_word_tokenizer(WORDS)
    tokenizer.add_tokens(["\n", "paris\nrome"])
    colon, merged = tokenizer.convert_tokens_to_ids([":", "paris\nrome"])
    task = _squad(tokenizer, max_new_tokens=2)
    assert merged not in task.stop_token_ids
    scorer = _Bigram({colon: merged, merged: merged}, len(tokenizer))
    assert task.predict(scorer, task.encode([SQUAD_ROW]), batch_size=1) == ["paris"]


def test_generation_prompt_leaves_room_for_new_tokens(opt_dir, opt_tokenizer) -> None:
    """tiny-opt has 128 positions: a 127-token training prompt must be cut to fit 8 new tokens,
    or generation indexes past the position table."""
    model = _opt_model(opt_dir)
    row = {**_film_rows(1)[0], "context": "the staff was lovely . " * 60}
    task = _squad(opt_tokenizer, max_length=128, max_new_tokens=8)
    examples = task.encode([row])
    assert len(examples.prompt_ids[0]) + len(examples.target_ids[0]) == 128
    prompt = examples.prompt_ids[0]
    kept = [prompt[0], *prompt[-119:]]  # BOS and the prompt's last 128 - 8 - 1 tokens
    assert task.predict(model, examples, batch_size=1) == [
        _reference_greedy(model, opt_tokenizer, kept, 8)
    ]


def test_evaluate_on_tiny_opt_returns_fractions(opt_dir, opt_tokenizer) -> None:
    task = _squad(opt_tokenizer, max_length=128, max_new_tokens=4)
    scores = task.evaluate(_opt_model(opt_dir), task.encode(_film_rows(5)), batch_size=2)
    assert task.metric == "f1" and set(scores) == {"exact_match", "f1"}
    assert all(0.0 <= value <= 1.0 for value in scores.values())


# ------------------------------------------------------------------------------------ rows


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"question": None}, "field 'question' .* missing or empty"),
        ({"title": "   "}, "field 'title' .* missing or empty"),
        ({"answers": []}, "field 'answers' is an empty list"),
        ({"answers": "Paris"}, "field 'answers' must be a list .* not str"),
        ({"answers": ["Paris", " "]}, "field 'answers' holds an empty or non-string answer"),
    ],
)
def test_check_rows_names_source_row_and_field(words, change, message) -> None:
    task = _squad(words)
    bad = {key: value for key, value in {**SQUAD_ROW, **change}.items() if value is not None}
    task.check_rows([SQUAD_ROW], "train.jsonl")  # a good row passes
    with pytest.raises(ConfigError, match=rf"^task.train_path='x' row 1: {message}"):
        task.check_rows([SQUAD_ROW, bad], "task.train_path='x'")


@pytest.mark.parametrize(
    ("template", "options", "message"),
    [
        ("Q: {}\nA:", {}, "must be a plain field name"),
        ("Q: {question!r}\nA:", {}, "must be a plain field name"),
        ("Q: {question\nA:", {}, "malformed"),
        ("Answer:", {}, "reads no field"),
        ("Q: {question} {answers}\nA:", {}, "reads the answer field"),
        ("Q: {question}\nA:", {"max_length": 16, "max_new_tokens": 16}, "no room for the prompt"),
    ],
)
def test_bad_settings_are_rejected(words, template, options, message) -> None:
    options = {"max_length": None, **options}
    with pytest.raises(ConfigError, match=message):
        GenerationTask(words, template=template, answer_field="answers", **options)


def test_answer_suffix_extends_the_target_as_mezo_trains(words) -> None:
    """The presets train on "answer\\n" (MeZO): the loss also covers the newline that ends it."""
    plain = _squad(words).encode([SQUAD_ROW])
    suffixed = GenerationTask(
        words, template=SQUAD_TEMPLATE, answer_field="answers", max_length=None, answer_suffix="\n"
    ).encode([SQUAD_ROW])
    newline = words.convert_tokens_to_ids("\n")
    assert suffixed.prompt_ids == plain.prompt_ids
    assert suffixed.target_ids[0] == [*plain.target_ids[0], newline]


def test_presets_build_generation_tasks_with_the_newline_suffix(words) -> None:
    from privzo.config import TaskConfig
    from privzo.tasks import build_task, resolve_task_config

    config = resolve_task_config(TaskConfig(name="squad"), "causal")
    task = build_task(config, words, "causal", position_limit=128)
    assert task.answer_suffix == "\n" and task.max_length == 128


def test_public_example_is_the_template_alone_and_scores(opt_dir, opt_tokenizer) -> None:
    """The input a rank with an empty batch forwards (ZeRO-3): template only, a finite loss."""
    task = _squad(opt_tokenizer)
    example = task.public_example()
    blank = task.encode([{**dict.fromkeys(task.fields, ""), "answers": ["yes"]}])
    assert example.prompt_ids == blank.prompt_ids and example.target_ids == blank.target_ids
    loss = task.per_example_loss(_opt_model(opt_dir), task.collate(example, [0]))
    assert loss.shape == (1,) and torch.isfinite(loss).all()
