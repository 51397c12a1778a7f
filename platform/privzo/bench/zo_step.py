"""``privzo bench zo-step``: what a zeroth-order step costs next to inference, measured.

For a randomly initialised model of a named shape (``tiny``, the 5.3M-parameter CPU model, up
to ``opt-66b`` and ``llama-3.1-70b``, or a local directory's config.json; nothing is
downloaded), on one device and dtype, in one process, the cases run
interleaved and each is timed and its peak memory taken:

* ``forward``: the inference forward the step makes twice (the same scoring forward);
* ``dpzero`` and ``mezo``: privzo's steps (three sweeps; in half precision the virtual
  perturbation), through ``zo_step`` with the perturber a run would use on this device;
* ``dpzero_k`` (with ``directions`` K > 1): DPZero's step with K directions (DP-AggZO: 2K
  forwards and 4K − 1 sweeps), measured against K DPZero steps;
* ``mezo_reference``: MeZO's step as its paper's code does it (``mezo_reference``);
* ``one_sweep``: one update sweep of privzo's perturber over every weight;
* ``one_sweep_per_tensor`` (fused kernels only): the same sweep launched once per parameter;
* ``read_write``: one read and write of every weight (``p.add_(0)``), the floor of a sweep;
* on CPU in fp32 also ``one_sweep_philox``: the same sweep with the counter-based generator.

With ``families``, the forward and DPZero's step of each family's tiny shape run instead, in
one round-robin, and each family's step ÷ two forwards is set against OPT's.

Every figure printed is measured here; the project's targets are shown beside them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from privzo.algorithms.config import MAX_DIRECTIONS
from privzo.bench.checks import BenchSetup, checked_setup, needed_bytes
from privzo.bench.mezo_reference import mezo_reference_step
from privzo.bench.report import FamilyStepReport, ZoStepReport, family_report, report
from privzo.memory import PeakMemory
from privzo.models.shapes import TINY_SHAPES, random_model
from privzo.privacy.sampling import PoissonSampler
from privzo.tasks.classification import (
    Batch,
    EncodedExamples,
    collate_examples,
    score_label_logits,
)
from privzo.zo import kernels
from privzo.zo.directions import DirectionSampler, resolve_generator, step_seed
from privzo.zo.estimators import GradientEstimator, make_estimator
from privzo.zo.perturbation import Perturber, VirtualPerturber, make_perturber
from privzo.zo.philox import philox_key
from privzo.zo.step import StepRecord, zo_step
from privzo.zo.sweeps import full_shards, sweep

LABEL_IDS = (10, 11)  # two label words scored at the last position, as a classification task
PERTURBATION_SCALE, LEARNING_RATE = 1e-3, 1e-6


@dataclass(frozen=True)
class Case:
    """A measured action, and what to do before and after it outside the measurement."""

    action: Callable[[], Any]
    before: Callable[[], None] | None = None
    after: Callable[[], None] | None = None


@dataclass(frozen=True)
class StepBench:
    """What both step benchmarks run on (device, dtype, batch), how many timed rounds, and
    whether they print their progress; refused before any model is built if ``repeats`` < 1."""

    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16
    seq_len: int = 128
    repeats: int = 5
    progress: bool = True

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"--repeats={self.repeats}: allowed: 1 or more")

    def setup(self, shape: str) -> BenchSetup:
        """``shape`` on this device and batch, refused if the machine cannot run it."""
        return checked_setup(shape, self.device, self.dtype, self.batch_size, self.seq_len)

    def measure(
        self, cases: dict[str, Case], where: torch.device
    ) -> dict[str, tuple[float, float]]:
        """(median seconds, median peak MiB) per case, timed ``repeats`` rounds, interleaved
        (``measure_rounds``)."""
        rounds = measure_rounds(cases, [PeakMemory(where)], self.repeats, self.progress, where)
        peaks = rounds.peaks[0]
        median = statistics.median
        return {name: (median(rounds.seconds[name]), median(peaks[name])) for name in cases}


def zo_step_benchmark(bench: StepBench, shape: str = "tiny", directions: int = 1) -> ZoStepReport:
    """Measure every case on ``shape``; refuses a request the machine cannot run first."""
    if not 1 <= directions <= MAX_DIRECTIONS:
        raise ValueError(f"--directions={directions}: allowed: 1..{MAX_DIRECTIONS}")
    setup = bench.setup(shape)
    if bench.progress:
        print(f"building {shape} ({bench.dtype}) on {setup.device}", flush=True)
    model = random_model(setup.arch, bench.dtype, device=setup.device)
    batch = random_batch(setup)
    measured = bench.measure(_cases(setup, model, batch, directions), setup.device)
    parameters = sum(p.numel() for p in model.parameters())
    return report(setup, measured, parameters, bench.repeats, needed_bytes(setup), directions)


def family_step_benchmark(bench: StepBench) -> FamilyStepReport:
    """The forward and DPZero's step of each family's tiny shape (``tiny``, ``tiny-llama``,
    ``tiny-qwen2``, ``tiny-mistral``), every model's cases in one round-robin, so the machine's
    drift touches each family alike and the step ratios compare across families."""
    setups = [bench.setup(shape) for shape in TINY_SHAPES]
    cases: dict[str, Case] = {}
    parameters: dict[str, int] = {}
    for setup in setups:
        if bench.progress:
            print(f"building {setup.shape} ({bench.dtype}) on {setup.device}", flush=True)
        model = random_model(setup.arch, bench.dtype, device=setup.device)
        parameters[setup.shape] = sum(p.numel() for p in model.parameters())
        batch = random_batch(setup)
        loss = label_loss(setup, model, batch)
        step = _privzo_step(_weights(setup, model), batch, loss, "dpzero", bench.batch_size)
        cases.update({f"{setup.shape}/forward": Case(loss), f"{setup.shape}/dpzero": Case(step)})
    measured = bench.measure(cases, setups[0].device)
    return family_report(setups, measured, parameters, bench.repeats)


def random_batch(setup: BenchSetup) -> Batch:
    """Random tokens, already on the device: the forward measures no host-to-device copy."""
    generator = torch.Generator().manual_seed(0)
    shape = (setup.batch_size, setup.seq_len)
    input_ids = torch.randint(4, setup.arch.vocab, shape, generator=generator)
    labels = torch.randint(0, len(LABEL_IDS), (setup.batch_size,), generator=generator)
    return Batch(
        input_ids=input_ids.to(setup.device),
        attention_mask=torch.ones_like(input_ids).to(setup.device),
        positions=torch.full((setup.batch_size,), setup.seq_len - 1).to(setup.device),
        labels=labels.to(setup.device),
    )


class PrivzoWeights:
    """privzo's hold on the model's weights: shards (flat views of every weight) and the
    perturber a run would use. MeZO's reference step replaces every weight tensor
    (``param.data = ...``), so this is released before it (a view would keep the replaced
    tensor alive, doubling MeZO's peak) and built again after it, both outside the clock."""

    def __init__(self, model: nn.Module, sampler: DirectionSampler) -> None:
        self.model, self.sampler = model, sampler
        self.build()

    def build(self) -> None:
        self.shards = full_shards(self.model.named_parameters())
        self.perturber: Perturber | None = make_perturber(self.model, self.shards, self.sampler)

    def release(self) -> None:
        if isinstance(self.perturber, VirtualPerturber):
            self.perturber.remove()  # its forward hooks hold the shards too
        self.shards, self.perturber = [], None


def label_loss(setup: BenchSetup, model: nn.Module, batch: Batch) -> Callable[..., torch.Tensor]:
    """The per-example loss a step evaluates: cross-entropy over the label words' logits."""
    label_ids = torch.tensor(LABEL_IDS, device=setup.device)

    def loss(_batch: Batch = batch) -> torch.Tensor:
        logits = score_label_logits(model, _batch, label_ids)
        labels = _batch.labels.to(logits.device)
        return nn.functional.cross_entropy(logits, labels, reduction="none")

    return loss


def _weights(setup: BenchSetup, model: nn.Module) -> PrivzoWeights:
    generator = resolve_generator("auto", setup.device)
    return PrivzoWeights(model, DirectionSampler("gaussian", setup.device, generator=generator))


def _cases(setup: BenchSetup, model: nn.Module, batch: Batch, directions: int) -> dict[str, Case]:
    loss = label_loss(setup, model, batch)
    weights = _weights(setup, model)
    parameters = list(model.parameters())
    seeds = iter(range(1, 10**9))
    cases = {
        "forward": Case(loss),
        "dpzero": Case(_privzo_step(weights, batch, loss, "dpzero", setup.batch_size)),
        "mezo": Case(_privzo_step(weights, batch, loss, "mezo", setup.batch_size)),
        "mezo_reference": Case(
            lambda: mezo_reference_step(
                parameters, next(seeds), loss, PERTURBATION_SCALE, LEARNING_RATE
            ),
            before=weights.release,
            after=weights.build,
        ),
        "one_sweep": Case(lambda: _perturber(weights).update(7, 1e-9)),
        "read_write": Case(lambda: _read_write(parameters)),
        "host_batch": Case(_host_batch(setup)),
    }
    if directions > 1:
        step = _privzo_step(weights, batch, loss, "dpzero", setup.batch_size, directions)
        cases["dpzero_k"] = Case(step)
    if weights.sampler.fused:
        cases["one_sweep_per_tensor"] = Case(lambda: _per_tensor_sweep(weights, 7, 1e-9))
    if setup.device.type == "cpu" and setup.dtype == "float32":
        philox = DirectionSampler("gaussian", generator="philox")
        cases["one_sweep_philox"] = Case(lambda: sweep(weights.shards, philox, 7, 1e-9))
    return cases


HOST_DATASET_SIZE = 1000  # MeZO's OPT training set size


def _host_batch(setup: BenchSetup) -> Callable[[], None]:
    """What a step does on the host before its forwards: draw a Poisson batch (expected size
    B of N = 1000 records) with the secret generator, pad it (``collate_examples``) and copy it
    to the device. Records are random token ids of L/2 to L tokens."""
    generator = np.random.default_rng(0)
    lengths = generator.integers(setup.seq_len // 2, setup.seq_len + 1, HOST_DATASET_SIZE)
    examples = EncodedExamples(
        input_ids=[generator.integers(4, setup.arch.vocab, n).tolist() for n in lengths],
        positions=[int(n) - 1 for n in lengths],
        labels=generator.integers(0, len(LABEL_IDS), HOST_DATASET_SIZE),
    )
    sampler = PoissonSampler(HOST_DATASET_SIZE, setup.batch_size / HOST_DATASET_SIZE)

    def draw_and_collate() -> None:
        indices = sampler.next_batch()
        if len(indices):
            batch = collate_examples(examples, indices, pad=1)
            batch.input_ids.to(setup.device), batch.attention_mask.to(setup.device)

    return draw_and_collate


def _per_tensor_sweep(weights: PrivzoWeights, seed: int, coefficient: float) -> None:
    """The update sweep with one fused launch per parameter instead of one per dtype group:
    the reference the multi-tensor launch is measured against (same values, bit for bit)."""
    transform = weights.sampler.philox_transform
    for shard in weights.shards:
        key = philox_key(seed, shard.name)
        if shard.tensor.dtype == torch.float32:
            kernels.add_direction_(shard.tensor, key, shard.offset, coefficient, transform)
        else:
            kernels.rounded_update_(shard.tensor, key, shard.offset, coefficient, transform)


def _perturber(weights: PrivzoWeights) -> Perturber:
    assert weights.perturber is not None, "privzo's weights are released only during MeZO's step"
    return weights.perturber


def bench_estimator(algorithm: str, batch_size: int) -> GradientEstimator:
    """The benches' estimator: DPZero's at clip 1 and noise multiplier 1, or MeZO's mean."""
    if algorithm == "dpzero":
        return make_estimator(
            "gaussian", clip=1.0, noise_multiplier=1.0, expected_batch_size=batch_size
        )
    return make_estimator()


def bench_step(
    perturber: Perturber,
    batch: Batch,
    loss: Callable[..., torch.Tensor],
    estimator: GradientEstimator,
    batch_size: int,
    seed_index: int,
    directions: int = 1,
) -> StepRecord:
    """One step at the benches' learning rate and perturbation, with the public seed of step
    ``seed_index`` of run seed 0."""
    return zo_step(
        step=0,
        seed=step_seed(0, seed_index),
        perturber=perturber,
        batch=batch,
        batch_size=batch_size,
        loss_fn=loss,
        estimator=estimator,
        learning_rate=LEARNING_RATE,
        perturbation_scale=PERTURBATION_SCALE,
        directions=directions,
    )


def _privzo_step(
    weights: PrivzoWeights,
    batch: Batch,
    loss: Callable[..., torch.Tensor],
    algorithm: str,
    batch_size: int,
    directions: int = 1,
) -> Callable[[], Any]:
    estimator = bench_estimator(algorithm, batch_size)
    steps = iter(range(10**9))
    return lambda: bench_step(
        _perturber(weights), batch, loss, estimator, batch_size, next(steps), directions
    )


@torch.no_grad()
def _read_write(parameters: list[nn.Parameter]) -> None:
    for parameter in parameters:
        parameter.add_(0)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read around it measures it (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Rounds:
    """Per case, the timed rounds' seconds, and the peak (MiB) of each memory measured, in the
    order the memories were given."""

    seconds: dict[str, list[float]]
    peaks: list[dict[str, list[float]]]


def measure_rounds(
    cases: dict[str, Case],
    memories: Sequence[PeakMemory],
    repeats: int,
    progress: bool,
    device: torch.device,
) -> Rounds:
    """Every case ``repeats`` timed rounds, with every memory's peak.

    The cases run round-robin, one warm-up round first, so slow drift of the machine (clock,
    other processes, allocator state) touches every case alike instead of biasing a ratio.
    On CUDA the device is synchronised before the clock starts and before it stops; every
    memory's peak is reset just before the clock starts.
    """
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    peaks: list[dict[str, list[float]]] = [{name: [] for name in cases} for _ in memories]
    for round_index in range(repeats + 1):
        if progress:
            print(f"round {round_index}/{repeats} ({'warm-up' if round_index == 0 else 'timed'})")
        for name, case in cases.items():
            if case.before is not None:
                case.before()
            synchronize(device)
            for memory in memories:
                memory.reset()
            started = time.perf_counter()
            case.action()
            synchronize(device)
            elapsed = time.perf_counter() - started
            if round_index > 0:
                seconds[name].append(elapsed)
                for memory, peak in zip(memories, peaks, strict=True):
                    peak[name].append(memory.peak_mb())
            if case.after is not None:
                case.after()
    return Rounds(seconds, peaks)
