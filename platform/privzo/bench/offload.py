"""``privzo bench offload``: a ZeRO-3 step with its partitions offloaded, beside the planner.

A randomly initialised model of a named shape is built partitioned (``zero.Init``) in a world of
one process, its partitions in host memory (``parallel.offload: cpu``, DeepSpeed's
``offload_param``) or, for comparison, on the device (``none``), and driven by the loader and
perturber a zero3 run uses. Round-robin, one warm-up round first, it times a forward of the
offloaded engine (every layer copied in and gathered), MeZO's step and DPZero's, each with the
device's peak (the CUDA allocator's) and the process's host peak (RSS), and sets them beside
``privzo.planner.plan`` for the same shape, dtype, forward batch, length and offload.

MeZO runs first in every round, so the first MeZO step sees the weights as built, before any
DPZero noise moved them: its projected gradient is a function of the weights, the batch and the
seed alone, the same offloaded or not where the arithmetic is (on one CPU, bit for bit).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from privzo.bench.checks import BenchSetup, checked_setup
from privzo.bench.zo_step import (
    Case,
    bench_estimator,
    bench_step,
    label_loss,
    measure_rounds,
    random_batch,
)
from privzo.distributed.checks import host_memory_gb
from privzo.distributed.zero3 import PartitionedModel, partitioned_random_model, world_of_one
from privzo.layouts.config import ParallelConfig
from privzo.memory import PeakMemory, return_freed_memory
from privzo.planner import Plan, plan
from privzo.zo.directions import DirectionSampler, resolve_generator
from privzo.zo.perturbation import Perturber

_MIB, _GIB = 2**20, 2**30
OFFLOADS = ("cpu", "none")
ATTENTION = "sdpa"  # the model's and the plan's: what transformers picks where it can
CASES = ("forward", "mezo", "dpzero")  # the order in each round: MeZO before any DPZero noise
STEPS = ("mezo", "dpzero")


@dataclass(frozen=True)
class OffloadBench:
    """What the benchmark runs: shape, device, dtype, batch, where the partitions live, how
    many timed rounds; refused before anything is built where a value has no meaning."""

    shape: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16
    seq_len: int = 128
    repeats: int = 3
    offload: str = "cpu"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"--repeats={self.repeats}: allowed: 1 or more")
        if self.offload not in OFFLOADS:
            raise ValueError(f"--offload={self.offload!r}: allowed: {', '.join(OFFLOADS)}")


@dataclass(frozen=True)
class OffloadReport:
    """The measured figures, the planner's for the same plan, and their ratios. Memory in MiB;
    ``device_peak_mb`` is None on CPU, where the device is the host (``host_peak_mb``)."""

    shape: str
    parameters: int
    device: str
    device_name: str
    dtype: str
    batch_size: int
    sequence_length: int
    attention: str
    threads: int
    repeats: int
    offload: str
    partitions_on: str  # the device of the partitions (ds_tensor) between forwards
    offload_param: str  # where the engine says it offloads them (DeepSpeed's offload_param)
    seconds: dict[str, float]  # median of the timed rounds, per case
    device_peak_mb: dict[str, float] | None  # the largest of the timed rounds, per case
    host_peak_mb: dict[str, float]
    # where /proc/self/clear_refs cannot be written, a host peak is the process's since its start
    host_peak_since_start: bool
    plan: dict[str, Any]  # privzo.planner.plan(...).to_json()
    ratios: dict[str, float | None]
    projected_gradients: dict[str, list[float]]  # every step's, warm-up first

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "table": self.table()}

    def table(self) -> str:
        """The figures a reader compares, one per line."""
        mib = _MIB
        device_peak = "" if self.device_peak_mb is None else f"{self.device_peak_mb['dpzero']:,.0f}"
        lines = [
            f"ZeRO-3, partitions offloaded to {self.offload} ({self.partitions_on}): "
            f"{self.shape} ({self.parameters:,} parameters, {self.dtype}) on {self.device_name}, "
            f"batch {self.batch_size} x {self.sequence_length}, median of {self.repeats}",
            f"{'case':<9} {'seconds':>9} {'device peak MiB':>16} {'host peak MiB':>14}",
        ]
        for case in CASES:
            device = "-" if self.device_peak_mb is None else f"{self.device_peak_mb[case]:,.0f}"
            lines.append(
                f"{case:<9} {self.seconds[case]:>9.4f} {device:>16} "
                f"{self.host_peak_mb[case]:>14,.0f}"
            )
        lines += [
            f"planner ({self.plan['strategy']}, {self.attention} attention): "
            f"{self.plan['bytes_per_gpu'] / mib:,.0f} MiB on the GPU, "
            f"{self.plan['host_bytes'] / mib:,.0f} MiB of host memory, "
            f"{self.plan['offload_bytes_per_step'] / mib:,.0f} MiB moved per step",
            f"measured / planner: device peak {_shown(self.ratios['device_peak_over_planner'])}"
            f"{' (' + device_peak + ' MiB)' if device_peak else ' (the device is the host)'}, "
            f"host peak {_shown(self.ratios['host_peak_over_planner'])}"
            f"{' (host peaks since the process started)' if self.host_peak_since_start else ''}",
            f"dpzero step / 2 forwards {self.ratios['dpzero_step_over_two_forwards']:.2f}, "
            f"mezo {self.ratios['mezo_step_over_two_forwards']:.2f}; planner's bytes of one "
            f"forward / its time: {_shown(self.ratios['moved_gb_per_s'])} GB/s",
        ]
        return "\n".join(lines)


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def offload_plan(setup: BenchSetup, offload: str) -> Plan:
    """The planner's verdict for ``setup`` on one GPU of this device's memory (the host's, on
    CPU), the host's memory judged too: what ``privzo check`` computes for such a run."""
    host = host_memory_gb(ParallelConfig())
    if setup.device.type == "cuda":
        device_gb = torch.cuda.get_device_properties(setup.device).total_memory / _GIB
    else:
        device_gb = host
    return plan(
        setup.arch,
        gpus=1,
        gpu_memory_gb=device_gb,
        dtype=setup.dtype,
        batch_size=setup.batch_size,
        seq_len=setup.seq_len,
        attention=ATTENTION,
        offload=offload,
        host_memory_gb=host if offload != "none" else None,
        forwards_per_step=2,
    )


def _check_plan(setup: BenchSetup, verdict: Plan) -> None:
    """Refuse, before anything is built, what the planner says the device or host cannot hold."""
    if verdict.fits:
        return
    where = f"{verdict.bytes_per_gpu / _GIB:.1f} GiB on the {setup.device.type} device"
    has = f"the device has {verdict.gpu_memory_bytes / _GIB:.1f} GiB"
    advice = "choose a smaller shape or batch"
    if verdict.offload == "none":
        advice += ", or --offload cpu"
    else:
        where += f" and {verdict.host_bytes / _GIB:.1f} GiB of host memory"
        has += f", the host {(verdict.host_memory_bytes or 0) / _GIB:.1f} GiB"
    raise ValueError(
        f"shape {setup.shape} ({setup.dtype}, batch {setup.batch_size} x {setup.seq_len}, "
        f"offload {verdict.offload}) needs about {where} (planner); {has}, each less a 10% "
        f"margin; {advice}"
    )


def offload_benchmark(bench: OffloadBench) -> OffloadReport:
    """Build, measure and compare; refuses what the machine cannot run before building."""
    setup = checked_setup(
        bench.shape, bench.device, bench.dtype, bench.batch_size, bench.seq_len, fit=False
    )
    verdict = offload_plan(setup, bench.offload)
    _check_plan(setup, verdict)
    use_gpu = setup.device.type == "cuda"
    parallel = ParallelConfig(strategy="zero3", offload=bench.offload, use_gpu=use_gpu)
    with world_of_one(use_gpu):
        if bench.progress:
            print(f"building {bench.shape} ({bench.dtype}) partitioned, offload {bench.offload}")
        model, alive = partitioned_random_model(
            setup.arch, setup.dtype, parallel, attn_implementation=ATTENTION
        )
        return_freed_memory()  # as a run does once its model is built
        loader = PartitionedModel()
        shards = loader.shards(list(model.named_parameters()))
        generator = resolve_generator("auto", setup.device)
        sampler = DirectionSampler("gaussian", setup.device, generator=generator)
        perturber = loader.perturber(model, shards, sampler)
        steps = _Steps(setup, model, perturber)
        measured = _measure(steps, setup.device, bench.repeats, bench.progress)
        offloaded = alive[1].zero_offload_param()  # the engine's configuration, None without
        device = None if offloaded is None else offloaded.device  # a str or a str enum
        engine_says = "none" if device is None else getattr(device, "value", device)
        where = (str(shards[0].tensor.device), str(engine_says))
        del alive, perturber, steps, shards, model
    return _report(bench, setup, verdict, measured, where)


class _Steps:
    """The measured actions on the offloaded model, and every step's projected gradient."""

    def __init__(self, setup: BenchSetup, model: torch.nn.Module, perturber: Perturber) -> None:
        self.setup, self.perturber = setup, perturber
        self.parameters = sum(p.ds_numel for p in model.parameters())  # type: ignore[attr-defined]
        self.batch = random_batch(setup)
        self.loss = label_loss(setup, model, self.batch)
        self.seeds = iter(range(10**9))
        self.projected: dict[str, list[float]] = {name: [] for name in STEPS}
        self.estimators = {name: bench_estimator(name, setup.batch_size) for name in STEPS}

    def cases(self) -> dict[str, Callable[[], Any]]:
        return {
            "forward": self.loss,
            "mezo": lambda: self.step("mezo"),
            "dpzero": lambda: self.step("dpzero"),
        }

    def step(self, algorithm: str) -> None:
        record = bench_step(
            self.perturber,
            self.batch,
            self.loss,
            self.estimators[algorithm],
            self.setup.batch_size,
            next(self.seeds),
        )
        self.projected[algorithm].append(record.projected_gradient)


@dataclass
class _Measured:
    """Per case: the timed rounds' seconds and peaks; the parameters and projected gradients."""

    seconds: dict[str, list[float]]
    device_peaks: dict[str, list[float]] | None
    host_peaks: dict[str, list[float]]
    host_peak_since_start: bool
    parameters: int
    projected: dict[str, list[float]]


def _measure(steps: _Steps, device: torch.device, repeats: int, progress: bool) -> _Measured:
    """Every case's rounds (``measure_rounds``), with the host's peak and, on CUDA, the
    device's."""
    cases = {name: Case(action) for name, action in steps.cases().items()}
    host = PeakMemory("cpu")
    memories = [host, PeakMemory(device)] if device.type == "cuda" else [host]
    rounds = measure_rounds(cases, memories, repeats, progress, device)
    device_peaks = rounds.peaks[1] if len(memories) > 1 else None
    host_peaks, since_start = rounds.peaks[0], not host.resettable
    return _Measured(
        rounds.seconds, device_peaks, host_peaks, since_start, steps.parameters, steps.projected
    )


def _report(
    bench: OffloadBench,
    setup: BenchSetup,
    verdict: Plan,
    measured: _Measured,
    where: tuple[str, str],
) -> OffloadReport:
    seconds = {name: statistics.median(times) for name, times in measured.seconds.items()}
    host_peak = {name: max(peaks) for name, peaks in measured.host_peaks.items()}
    device_peak = None
    if measured.device_peaks is not None:
        device_peak = {name: max(peaks) for name, peaks in measured.device_peaks.items()}
    step_device = None if device_peak is None else max(device_peak[name] for name in STEPS)
    step_host = max(host_peak[name] for name in STEPS)
    moved_per_forward = verdict.offload_bytes_per_step / 2
    ratios: dict[str, float | None] = {
        **{
            f"{name}_step_over_two_forwards": seconds[name] / (2 * seconds["forward"])
            for name in STEPS
        },
        "device_peak_over_planner": None
        if step_device is None
        else step_device * _MIB / verdict.bytes_per_gpu,
        "host_peak_over_planner": step_host * _MIB / verdict.host_bytes
        if verdict.host_bytes
        else None,
        "moved_gb_per_s": moved_per_forward / seconds["forward"] / 1e9
        if moved_per_forward
        else None,
    }
    device = setup.device
    return OffloadReport(
        shape=setup.shape,
        parameters=measured.parameters,
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=setup.dtype,
        batch_size=setup.batch_size,
        sequence_length=setup.seq_len,
        attention=ATTENTION,
        threads=torch.get_num_threads(),
        repeats=bench.repeats,
        offload=bench.offload,
        partitions_on=where[0],
        offload_param=where[1],
        seconds=seconds,
        device_peak_mb=device_peak,
        host_peak_mb=host_peak,
        host_peak_since_start=measured.host_peak_since_start,
        plan=verdict.to_json(),
        ratios=ratios,
        projected_gradients=measured.projected,
    )
