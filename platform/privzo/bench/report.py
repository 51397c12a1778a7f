"""The zo-step benchmark's ratios, the targets they are compared with, and its table; and what
every benchmark's result offers the CLI (``BenchResult``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from privzo.bench.checks import BenchSetup

_GIB = 2**30
STEPS = ("dpzero", "mezo", "mezo_reference")
# The project's targets per device (docs/performance/index.md). cuda: one H100, fp16, batch
# 16 x 128, OPT-13B (the memory and MeZO ratios for any shape). cpu: the tiny model, fp32,
# 16 x 128; the step ratio's 1.47 is a no-regression bound for the CPU step.
TARGETS: dict[str, dict[str, float | None]] = {
    "dpzero_step_over_two_forwards": {"cpu": 1.47, "cuda": 1.5},
    "dpzero_step_over_forward_memory": {"cpu": 1.05, "cuda": 1.02},
    "dpzero_over_mezo_time": {"cpu": 1.02, "cuda": 1.01},
    "dpzero_over_mezo_memory": {"cpu": 1.01, "cuda": None},
    "dpzero_over_mezo_reference_time": {"cpu": None, "cuda": 0.55},
    "sweep_over_read_write_time": {"cpu": None, "cuda": 2.2},
    "sweep_over_forward_time": {"cpu": None, "cuda": None},
    "philox_sweep_over_sweep_time": {"cpu": None, "cuda": None},
    "sweep_over_per_tensor_sweep_time": {"cpu": None, "cuda": None},
    "host_batch_over_dpzero_time": {"cpu": None, "cuda": 0.02},
    # K directions cost K steps' forwards and sweeps, nothing more, and no more memory
    "dpzero_k_over_k_dpzero_time": {"cpu": 1.05, "cuda": 1.05},
    "dpzero_k_over_dpzero_memory": {"cpu": 1.01, "cuda": 1.01},
    # a family's tiny shape: its step / 2 forwards over tiny OPT's, in the same run
    "family_step_over_opt_step": {"cpu": 1.10, "cuda": None},
}
LABELS = {
    "dpzero_step_over_two_forwards": "dpzero step / 2 forwards (time)",
    "dpzero_step_over_forward_memory": "dpzero step / forward (peak memory)",
    "dpzero_over_mezo_time": "dpzero / mezo (time)",
    "dpzero_over_mezo_memory": "dpzero / mezo (peak memory)",
    "dpzero_over_mezo_reference_time": "dpzero / MeZO reference step (time)",
    "sweep_over_read_write_time": "one sweep / read+write pass (time)",
    "sweep_over_forward_time": "one sweep / forward (time)",
    "philox_sweep_over_sweep_time": "philox sweep / sweep (time)",
    "sweep_over_per_tensor_sweep_time": "sweep / per-tensor launches (time)",
    "host_batch_over_dpzero_time": "sample + collate + copy / step (time)",
    "dpzero_k_over_k_dpzero_time": "dpzero_k / (K x dpzero) (time)",
    "dpzero_k_over_dpzero_memory": "dpzero_k / dpzero (peak memory)",
}


def ratios(measured: dict[str, tuple[float, float]], directions: int = 1) -> dict[str, float]:
    """Every ratio of measured figures (time: index 0, peak memory: index 1); ``dpzero_k``,
    where measured, is the step with ``directions`` K directions."""
    forward_time, forward_memory = measured["forward"]
    found: dict[str, float] = {}
    for name in STEPS:
        step_time, step_memory = measured[name]
        found[f"{name}_step_over_two_forwards"] = step_time / (2 * forward_time)
        found[f"{name}_step_over_forward_memory"] = step_memory / forward_memory
    for other in ("mezo", "mezo_reference"):
        found[f"dpzero_over_{other}_time"] = measured["dpzero"][0] / measured[other][0]
        found[f"dpzero_over_{other}_memory"] = measured["dpzero"][1] / measured[other][1]
    sweep_time = measured["one_sweep"][0]
    found["sweep_over_read_write_time"] = sweep_time / measured["read_write"][0]
    found["sweep_over_forward_time"] = sweep_time / forward_time
    found["host_batch_over_dpzero_time"] = measured["host_batch"][0] / measured["dpzero"][0]
    if "one_sweep_per_tensor" in measured:
        per_tensor = measured["one_sweep_per_tensor"][0]
        found["sweep_over_per_tensor_sweep_time"] = sweep_time / per_tensor
    if "one_sweep_philox" in measured:
        found["philox_sweep_over_sweep_time"] = measured["one_sweep_philox"][0] / sweep_time
    if "dpzero_k" in measured:
        dpzero_time, dpzero_memory = measured["dpzero"]
        found["dpzero_k_over_k_dpzero_time"] = measured["dpzero_k"][0] / (directions * dpzero_time)
        found["dpzero_k_over_dpzero_memory"] = measured["dpzero_k"][1] / dpzero_memory
    return found


class BenchResult(Protocol):
    """A benchmark's result: its JSON record (the table included) and the table it prints."""

    def to_json(self) -> dict[str, Any]: ...

    def table(self) -> str: ...


@dataclass(frozen=True)
class ZoStepReport:
    """Every figure and ratio of one zo-step benchmark, with the targets they are compared with."""

    shape: str
    model: dict[str, int]  # layers, hidden, ffn, heads, vocab, parameters
    device: str
    device_name: str
    dtype: str
    batch_size: int
    sequence_length: int
    threads: int
    repeats: int
    directions: int
    estimated_need_gib: float
    seconds: dict[str, float]
    peak_memory_mb: dict[str, float]
    ratios: dict[str, float]
    targets: dict[str, dict[str, float | None]]

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        return {**record, "table": format_table(record)}

    def table(self) -> str:
        return format_table(asdict(self))


def _run_header(setup: BenchSetup, repeats: int) -> dict[str, Any]:
    """Where and how a benchmark run measured: the fields every step report starts with."""
    device = setup.device
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": setup.dtype,
        "batch_size": setup.batch_size,
        "sequence_length": setup.seq_len,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
    }


def report(
    setup: BenchSetup,
    measured: dict[str, tuple[float, float]],
    parameters: int,
    repeats: int,
    estimated_bytes: int,
    directions: int = 1,
) -> ZoStepReport:
    """Every measured figure and ratio of one run of the benchmark."""
    return ZoStepReport(
        shape=setup.shape,
        model={
            "layers": setup.arch.layers,
            "hidden": setup.arch.hidden,
            "ffn": setup.arch.ffn,
            "heads": setup.arch.heads,
            "vocab": setup.arch.vocab,
            "parameters": parameters,
        },
        **_run_header(setup, repeats),
        directions=directions,
        estimated_need_gib=estimated_bytes / _GIB,
        seconds={name: value[0] for name, value in measured.items()},
        peak_memory_mb={name: value[1] for name, value in measured.items()},
        ratios=ratios(measured, directions),
        targets=TARGETS,
    )


def format_table(result: dict[str, Any]) -> str:
    device = "cuda" if result["device"].startswith("cuda") else "cpu"
    lines = [
        f"ZO step benchmark: {result['shape']} ({result['model']['parameters'] / 1e6:.2f}M "
        f"parameters), {result['device_name']}, {result['dtype']}, batch "
        f"{result['batch_size']} x {result['sequence_length']} tokens, {result['threads']} "
        f"threads, median of {result['repeats']}"
        + (f", dpzero_k: K = {result['directions']}" if result["directions"] > 1 else ""),
        f"{'case':<18}{'seconds':>10}{'peak MiB':>11}{'t/(2 fwd)':>11}{'mem/fwd':>9}",
    ]
    ratios_found = result["ratios"]
    for name, seconds in result["seconds"].items():
        time_ratio = ratios_found.get(f"{name}_step_over_two_forwards")
        memory_ratio = ratios_found.get(f"{name}_step_over_forward_memory")
        lines.append(
            f"{name:<18}{seconds:>10.4f}{result['peak_memory_mb'][name]:>11.1f}"
            f"{_shown(time_ratio):>11}{_shown(memory_ratio):>9}"
        )
    lines.append(f"{'ratio':<38}{'measured':>9}{'target cpu':>12}{'target cuda':>13}")
    for name, label in LABELS.items():
        if name not in ratios_found:
            continue
        value, target = ratios_found[name], TARGETS[name]
        bound = target[device]
        verdict = "" if bound is None else ("  ok" if value <= bound else "  ABOVE TARGET")
        lines.append(
            f"{label:<38}{value:>9.3f}{_bound(target['cpu']):>12}{_bound(target['cuda']):>13}"
            f"{verdict}"
        )
    lines.append(
        f"verdicts against the {device} targets; the cuda ones are for one H100, "
        "fp16, batch 16 x 128, OPT-13B"
    )
    return "\n".join(lines)


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _bound(value: float | None) -> str:
    return "-" if value is None else f"<= {value}"


@dataclass(frozen=True)
class FamilyStep:
    """One family's tiny shape: its median forward and DPZero step, in seconds."""

    shape: str
    family: str
    parameters: int
    forward_s: float
    dpzero_s: float

    @property
    def step_over_two_forwards(self) -> float:
        return self.dpzero_s / (2 * self.forward_s)


@dataclass(frozen=True)
class FamilyStepReport:
    """Every family's step ÷ two forwards from one interleaved run, and each over OPT's."""

    device: str
    device_name: str
    dtype: str
    batch_size: int
    sequence_length: int
    threads: int
    repeats: int
    families: tuple[FamilyStep, ...]

    def over_opt(self) -> dict[str, float]:
        """Each family's step ÷ two forwards over OPT's (OPT's own is 1)."""
        opt = next(step for step in self.families if step.family == "opt")
        return {
            step.family: step.step_over_two_forwards / opt.step_over_two_forwards
            for step in self.families
        }

    def target(self) -> float | None:
        return TARGETS["family_step_over_opt_step"]["cuda" if self.on_cuda else "cpu"]

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def to_json(self) -> dict[str, Any]:
        families = [
            {**asdict(step), "step_over_two_forwards": step.step_over_two_forwards}
            for step in self.families
        ]
        return {
            **asdict(self),
            "families": families,
            "step_over_opt_step": self.over_opt(),
            "targets": {"family_step_over_opt_step": TARGETS["family_step_over_opt_step"]},
        }

    def table(self) -> str:
        bound = self.target()
        lines = [
            f"ZO step by family: each family's tiny shape, {self.device_name}, {self.dtype}, "
            f"batch {self.batch_size} x {self.sequence_length} tokens, {self.threads} threads, "
            f"median of {self.repeats}, every model's cases interleaved",
            f"{'shape':<14}{'params':>8}{'forward s':>11}{'dpzero s':>10}{'t/(2 fwd)':>11}"
            f"{'/ opt':>8}{'target':>9}",
        ]
        for step in self.families:
            ratio = self.over_opt()[step.family]
            verdict = ""
            if step.family != "opt" and bound is not None:
                verdict = "  ok" if ratio <= bound else "  ABOVE TARGET"
            lines.append(
                f"{step.shape:<14}{step.parameters / 1e6:>7.2f}M{step.forward_s:>11.4f}"
                f"{step.dpzero_s:>10.4f}{step.step_over_two_forwards:>11.3f}{ratio:>8.3f}"
                f"{'-' if step.family == 'opt' else _bound(bound):>9}{verdict}"
            )
        lines.append(
            "/ opt: the family's step / 2 forwards over tiny OPT's in this run; target "
            f"{_bound(TARGETS['family_step_over_opt_step']['cpu'])} on cpu"
        )
        return "\n".join(lines)


def family_report(
    setups: list[BenchSetup],
    measured: dict[str, tuple[float, float]],
    parameters: dict[str, int],
    repeats: int,
) -> FamilyStepReport:
    """The report of the family benchmark's measured cases (``SHAPE/forward``, ``SHAPE/dpzero``)."""
    steps = tuple(
        FamilyStep(
            shape=setup.shape,
            family=setup.arch.family,
            parameters=parameters[setup.shape],
            forward_s=measured[f"{setup.shape}/forward"][0],
            dpzero_s=measured[f"{setup.shape}/dpzero"][0],
        )
        for setup in setups
    )
    return FamilyStepReport(
        **_run_header(setups[0], repeats),
        families=steps,
    )
