"""task.pad_to='max_length': batches of a public shape, their losses, bound and accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from privzo.algorithms.stepper import StepMeter
from privzo.algorithms.zeroth_order import ZerothOrderStepper
from privzo.config import ConfigError, TaskConfig
from privzo.memory import PeakMemory
from privzo.privacy import PoissonSampler, compute_epsilon
from privzo.privacy.truncation import (
    DEFAULT_SHARE,
    default_bound,
    exceed_probability,
    truncation_delta,
)
from privzo.run import build_context, plan_privacy
from privzo.tasks.build import build_task
from privzo.tasks.micro_batches import PublicShape, losses_in_micro_batches, padded_batch
from privzo.tasks.resolve import resolve_task_config
from word_tokenizer import build_word_tokenizer

WORDS = ["the", "film", "was", "dull", "bright", "and", "long", "It", "terrible", "great"]


@pytest.fixture(scope="module")
def task_and_model():
    """A prompt task over a word-level tokenizer and a tiny random OPT scoring it."""
    from transformers import OPTConfig, OPTForCausalLM

    tokenizer = build_word_tokenizer(WORDS)
    config = resolve_task_config(
        TaskConfig(template="{sentence} It was", label_words=["terrible", "great"]), "causal"
    )
    task = build_task(config, tokenizer, "causal", position_limit=32)
    torch.manual_seed(0)
    model = OPTForCausalLM(
        OPTConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            word_embed_proj_dim=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=32,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).eval()
    return task, model


def _examples(task):
    sentences = ["the film", "dull", "the film was long and dull and long and dull", "bright"]
    rows = [{"sentence": text, "label": i % 2} for i, text in enumerate(sentences * 3)]
    return task.encode(rows)


def _losses(task, model, examples, indices, shape):
    batch = padded_batch(task, examples, indices, shape)
    losses = losses_in_micro_batches(
        lambda chunk: task.per_example_loss(model, chunk), batch, shape.micro_batch
    )
    assert losses.shape == (shape.rows,)
    return losses[: len(indices)]


def test_an_examples_loss_is_bit_identical_whoever_shares_its_batch(task_and_model):
    task, model = task_and_model
    examples = _examples(task)
    shape = PublicShape(rows=8, micro_batch=4, length=32)
    # example 0 with short company, at row 0; then beside the long one (2), at row 2 of 5
    alone = _losses(task, model, examples, [0], shape)[0]
    short = _losses(task, model, examples, [0, 3, 7], shape)[0]
    crowded = _losses(task, model, examples, [1, 2, 0, 6, 9], shape)[2]
    assert torch.equal(alone, short) and torch.equal(alone, crowded)
    assert alone.dtype == torch.float32


def test_padding_rows_are_the_public_example_and_come_after_the_drawn_ones(task_and_model):
    task, _ = task_and_model
    examples = _examples(task)
    shape = PublicShape(rows=8, micro_batch=4, length=32)
    batch = padded_batch(task, examples, [2, 5, 7], shape)
    assert batch.input_ids.shape == (8, 32) and len(batch) == 8
    real = task.collate(examples, [2, 5, 7], 32)
    public = task.collate(task.public_example(), [0], 32)
    assert torch.equal(batch.input_ids[:3], real.input_ids)
    assert torch.equal(batch.labels[:3], real.labels)
    for row in range(3, 8):
        assert torch.equal(batch.input_ids[row], public.input_ids[0])
    empty = padded_batch(task, examples, np.zeros(0, dtype=np.int64), shape)
    assert empty.input_ids.shape == (8, 32)  # an empty draw forwards the same shape


def test_every_forward_of_a_private_run_has_the_public_shape(tiny_run_config, cache_dir):
    config = tiny_run_config("optimizer.physical_batch_size=4", "tracking.backend=none")
    assert config.pad_to == "max_length"  # the default of a private zeroth-order run
    context = build_context(config, cache_dir, progress=False)
    shapes: list[tuple[int, ...]] = []
    embeddings = context.scoring_model.get_input_embeddings()  # every forward starts here
    hook = embeddings.register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape))
    )
    stepper = ZerothOrderStepper(context, StepMeter(PeakMemory()))
    stepper.start()
    try:
        sizes = [stepper.step(step).record.batch_size for step in range(6)]
    finally:
        stepper.finish()
        hook.remove()
    rows = context.plan.max_batch_size
    assert rows is not None and rows % 4 == 0
    assert set(shapes) == {(4, context.task.max_length)}
    assert len(shapes) == 6 * 2 * rows // 4  # every step: the same forwards, whatever was drawn
    assert all(size <= rows for size in sizes) and len(set(sizes)) > 1  # real rows only


def test_poisson_draws_above_the_bound_keep_a_random_subset():
    sampler = PoissonSampler(100, 1.0, max_batch_size=10)
    draws = [sampler.next_batch() for _ in range(20)]
    for draw in draws:
        assert len(draw) == 10 and len(set(draw.tolist())) == 10
        assert np.all(np.diff(draw) > 0) and draw.min() >= 0 and draw.max() < 100
    assert len({tuple(draw.tolist()) for draw in draws}) > 1  # not the same ten each time
    below = PoissonSampler(100, 0.05, max_batch_size=100)
    assert all(len(below.next_batch()) <= 100 for _ in range(20))


def test_exceed_probability_is_the_binomial_tail_of_the_larger_neighbour():
    n, q, bound = 40, 0.2, 14
    direct = sum(math.comb(n + 1, k) * q**k * (1 - q) ** (n + 1 - k) for k in range(15, 42))
    assert exceed_probability(n, q, bound) == pytest.approx(direct, rel=1e-9)
    assert exceed_probability(n, q, n + 1) == 0.0  # no draw from N + 1 examples exceeds it
    assert exceed_probability(n, q, n) > 0.0  # q^(N+1), tiny but not nothing
    assert truncation_delta(n, q, bound, 10, 1.0) == pytest.approx((1 + math.e) * 10 * direct)


def test_the_default_bound_is_the_smallest_within_its_share():
    n, q, steps, budget = 2000, 64 / 2000, 800, 1e-9
    bound = default_bound(n, q, steps, budget, 1)
    assert steps * binom.sf(bound, n + 1, q) <= budget < steps * binom.sf(bound - 1, n + 1, q)
    assert default_bound(n, q, steps, budget, 16) == -(-bound // 16) * 16
    assert default_bound(n, q, steps, 0.0, 1) == n + 1  # pure DP: nothing may be truncated


def test_a_share_of_w_workers_is_bounded_alone_and_every_share_is_accounted():
    """W workers each draw from at most ⌈(N + 1)/W⌉ records: the union over the W shares."""
    n, q, shares = 1000, 16 / 1000, 8
    records = math.ceil((n + 1) / shares)
    assert exceed_probability(n, q, 9, shares) == pytest.approx(
        shares * binom.sf(9, records, q), rel=1e-12
    )
    assert exceed_probability(n, q, records, shares) == 0.0  # a share of all its records
    assert exceed_probability(n, q, 9, 1) == exceed_probability(n, q, 9)
    steps, budget = 800, 1e-9
    bound = default_bound(n, q, steps, budget, 1, shares)
    assert steps * exceed_probability(n, q, bound, shares) <= budget
    assert steps * exceed_probability(n, q, bound - 1, shares) > budget
    assert bound < default_bound(n, q, steps, budget, 1)  # a share's, not the whole batch's


def test_each_worker_pads_its_own_share_and_its_truncation_is_accounted(tiny_run_config):
    """A private run's workers pad to their share's bound, not the whole batch's; the δ that
    truncation takes counts every share, and the plan still meets ε."""
    single = plan_privacy(tiny_run_config(), 64)
    workers = ("parallel.strategy=replica", "parallel.workers=4")
    four = plan_privacy(tiny_run_config(*workers), 64)
    assert four.max_batch_size is not None and single.max_batch_size is not None
    assert four.max_batch_size < single.max_batch_size
    assert four.truncation_delta == truncation_delta(
        64, 8 / 64, four.max_batch_size, 12, 3.0, shares=4
    )
    assert 0 < four.truncation_delta <= DEFAULT_SHARE * 1e-5 and four.epsilon <= 3.0 * (1 + 1e-9)
    shuffled = ("optimizer.algorithm=mezo", "privacy.sampler=shuffle", "task.pad_to=max_length")
    assert plan_privacy(tiny_run_config(*shuffled, *workers), 64).max_batch_size == 2  # 8 / 4


def test_the_plan_calibrates_at_delta_less_truncation(tiny_run_config):
    micro_batches = ("optimizer.physical_batch_size=4",)
    config = tiny_run_config()
    plan = plan_privacy(config, 64)
    assert plan.delta == 1e-5 and 0 < plan.truncation_delta <= DEFAULT_SHARE * 1e-5
    assert plan.mechanism_delta == pytest.approx(1e-5 - plan.truncation_delta, rel=1e-12)
    epsilon = compute_epsilon(
        noise_multiplier=plan.noise_multiplier,
        sample_rate=8 / 64,
        steps=12,
        delta=plan.mechanism_delta,
        noise_parameters=plan.noise_parameters,
    )
    assert epsilon <= 3.0 * (1 + 1e-9)
    assert plan.truncation_delta == truncation_delta(64, 8 / 64, plan.max_batch_size, 12, 3.0)
    # the bound's rounding does not depend on σ: the σ found above, checked, not calibrated again
    fixed = f"privacy.noise_multiplier={plan.noise_multiplier!r}"
    rounded = plan_privacy(tiny_run_config("privacy.max_batch_size=30", *micro_batches, fixed), 64)
    assert rounded.max_batch_size == 32  # whole micro-batches of 4
    assert rounded.noise_multiplier == plan.noise_multiplier and rounded.epsilon <= 3.0
    batch = plan_privacy(tiny_run_config("task.pad_to=batch"), 64)
    assert batch.max_batch_size is None and batch.truncation_delta == 0.0


def test_a_bound_that_takes_too_much_delta_is_refused(tiny_run_config):
    refusal = r"privacy\.max_batch_size=9: .* more than half of privacy\.delta"
    with pytest.raises(ConfigError, match=refusal):
        plan_privacy(tiny_run_config("privacy.max_batch_size=9"), 64)
    pure = ("privacy.accountant=pure", "privacy.delta=0", "optimizer.algorithm=dpzo-laplace")
    assert plan_privacy(tiny_run_config(*pure), 64).max_batch_size == 65  # never truncated
    with pytest.raises(ConfigError, match=r"privacy\.max_batch_size=64"):
        plan_privacy(tiny_run_config(*pure, "privacy.max_batch_size=64"), 64)


def test_pad_to_settings_are_checked_at_load(tiny_run_config):
    assert tiny_run_config("optimizer.algorithm=mezo").pad_to == "batch"
    assert tiny_run_config("optimizer.algorithm=dpsgd").pad_to == "batch"
    with pytest.raises(ValueError, match=r"task\.pad_to='max_length' with optimizer\.algorithm"):
        tiny_run_config("optimizer.algorithm=dpsgd", "task.pad_to=max_length")
    with pytest.raises(ValueError, match=r"privacy\.max_batch_size=32 bounds the padded"):
        tiny_run_config("task.pad_to=batch", "privacy.max_batch_size=32")
