"""``privzo bench``: benchmarks that print what they measured on this machine (the zeroth-order
step, the fused kernels, every algorithm's memory, the distributed layouts)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from privzo.cli.arguments import (
    DTYPES,
    Commands,
    add_command,
    add_config,
    add_json,
    add_output_dir,
    add_subcommands,
    dtype_name,
    finish_command,
    load_run_config,
    path_argument,
)
from privzo.cli.process import quiet_libraries, stdout_to_stderr

if TYPE_CHECKING:
    from privzo.bench.report import BenchResult

SHAPES = (
    "tiny (an OPT of 5.32M parameters: 32.3 times the built-in demo-opt-s, and not the "
    "built-in tiny-opt), its sizes in another family (tiny-llama, tiny-qwen2, tiny-mistral), "
    "a named shape (opt-125m ... opt-66b, llama-3.1-8b, qwen2.5-7b, mistral-7b, ...: privzo "
    "plan --model all lists them), its hub id, or a model directory"
)


@dataclass(frozen=True)
class Bench:
    """One ``privzo bench`` command that measures and prints: its words, the options only it
    takes, and the measurement. Every one also takes ``--json`` (its result as JSON, else the
    table the result makes of itself) and the shared options of ``finish_command``."""

    name: str
    summary: str
    examples: str | list[str]
    add_options: Callable[[argparse.ArgumentParser], None]
    measure: Callable[[argparse.Namespace], BenchResult]
    description: str | None = None
    cache_dir: bool = True  # whether it builds a built-in model (into --cache-dir)

    def add_to(self, benches: Commands) -> None:
        parser = add_command(benches, self.name, self.summary, self.examples, self.description)
        self.add_options(parser)
        add_json(parser)
        finish_command(parser, self.print_measured, cache_dir=self.cache_dir)

    def print_measured(self, args: argparse.Namespace) -> int:
        _print_result(self.measure(args), args.json)
        return 0


def add_bench(commands: Commands) -> None:
    bench = add_command(
        commands,
        "bench",
        "benchmarks that print measured ratios",
        ["privzo bench zo-step", "privzo bench memory --json"],
    )
    benches = add_subcommands(bench, "bench_command")
    for measured in BENCHES:
        measured.add_to(benches)
    _add_kernels(benches)


# --- zo-step -----------------------------------------------------------------------------------


def _step_options(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The model, batch and rounds of a bench that times steps of a shape built from its config."""
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shape", default="tiny", help=f"the model's shape: {SHAPES}")
    parser.add_argument("--dtype", default="float32", help=f"the weights' dtype: {DTYPES}")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per step")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per example")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed rounds (their median)")


def _zo_step_options(zo_step: argparse.ArgumentParser) -> None:
    _step_options(zo_step, repeats=5)
    zo_step.add_argument(
        "--directions",
        type=int,
        default=1,
        help="K > 1 adds dpzero_k, DPZero's step with K directions (DP-AggZO), measured "
        "against K dpzero steps",
    )
    zo_step.add_argument(
        "--families",
        action="store_true",
        help="instead of one shape's cases, the forward and DPZero step of each family's tiny "
        "shape (tiny, tiny-llama, tiny-qwen2, tiny-mistral) interleaved in one run: each "
        "family's step / 2 forwards over OPT's, against its target",
    )


def _zo_step(args: argparse.Namespace) -> BenchResult:
    from privzo.bench.zo_step import StepBench, family_step_benchmark, zo_step_benchmark

    quiet_libraries(args.verbose)
    if args.families and (args.shape != "tiny" or args.directions != 1):
        raise ValueError(
            "--families runs each family's tiny shape with one direction; drop --shape and "
            "--directions"
        )
    bench = StepBench(
        device=args.device,
        dtype=dtype_name(args.dtype),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        repeats=args.repeats,
        progress=not args.json,
    )
    if args.families:
        return family_step_benchmark(bench)
    return zo_step_benchmark(bench, shape=args.shape, directions=args.directions)


# --- offload -----------------------------------------------------------------------------------


def _offload_options(offload: argparse.ArgumentParser) -> None:
    _step_options(offload, repeats=3)
    offload.add_argument(
        "--offload",
        default="cpu",
        help="where the partitions live between forwards: cpu (host memory, DeepSpeed's "
        "offload_param) or none (on the device, for comparison)",
    )


def _offload(args: argparse.Namespace) -> BenchResult:
    from privzo.bench.offload import OffloadBench, offload_benchmark

    bench = OffloadBench(
        shape=args.shape,
        device=args.device,
        dtype=dtype_name(args.dtype),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        repeats=args.repeats,
        offload=args.offload,
        progress=not args.json,
    )
    quiet_libraries(args.verbose)
    with stdout_to_stderr():  # DeepSpeed's own lines; stdout is kept for the result
        return offload_benchmark(bench)


# --- memory, distributed, pad-to ---------------------------------------------------------------


def _memory_options(memory: argparse.ArgumentParser) -> None:
    memory.add_argument("--repeats", type=int, default=3, help="timed steps per case")


def _memory(args: argparse.Namespace) -> BenchResult:
    from privzo.bench.memory import memory_benchmark

    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats}: allowed: 1 or more")
    quiet_libraries(args.verbose)  # the loads' "Loading weights" and "Writing model shards" bars
    return memory_benchmark(args.cache_dir, repeats=args.repeats, progress=not args.json)


def _distributed_options(distributed: argparse.ArgumentParser) -> None:
    distributed.add_argument(
        "--model", default="demo-opt-s", help="a built-in model or a model directory"
    )
    distributed.add_argument("--steps", type=int, default=30, help="DPZero steps per case")


def _distributed(args: argparse.Namespace) -> BenchResult:
    from privzo.bench.distributed import distributed_benchmark

    quiet_libraries(args.verbose)
    # ray.train.report waits on a health check, every 2 s unless told otherwise
    fast_report = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}
    os.environ.update(fast_report)
    with stdout_to_stderr():  # the workers' output; stdout is kept for the result
        result = distributed_benchmark(
            args.cache_dir, model=args.model, steps=args.steps, env_vars=fast_report
        )
        import ray

        ray.shutdown()
    return result


def _pad_to_options(pad_to: argparse.ArgumentParser) -> None:
    add_config(pad_to, "run", "configs/runs/tiny-dpzero.yaml")
    pad_to.add_argument("--steps", type=int, default=20, help="timed steps per case")


def _pad_to(args: argparse.Namespace) -> BenchResult:
    config = load_run_config(args)
    from privzo.bench.pad_to import pad_to_benchmark

    quiet_libraries(args.verbose)
    return pad_to_benchmark(config, args.cache_dir, args.steps)


# --- planner -----------------------------------------------------------------------------------


def _planner_options(planner: argparse.ArgumentParser) -> None:
    planner.add_argument("--model", required=True, type=path_argument, help="a model directory")
    add_output_dir(planner, "where each case's run is kept (and found again)")
    planner.add_argument("--algorithms", default="mezo,dpzero", help="comma-separated")
    planner.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    planner.add_argument(
        "--layouts", default="single,replica,zero3,zero3-offload", help="comma-separated"
    )
    planner.add_argument("--steps", type=int, default=2, help="steps per case")
    planner.add_argument("--batch-size", type=int, default=8, help="examples per step")
    planner.add_argument("--max-length", type=int, default=32, help="tokens per example at most")


def _planner(args: argparse.Namespace) -> BenchResult:
    from privzo.bench.planner_check import cases, planner_benchmark

    selected = cases(args.algorithms.split(","), args.dtypes.split(","), args.layouts.split(","))
    quiet_libraries(args.verbose)
    return planner_benchmark(
        str(args.model),
        args.output_dir,
        args.cache_dir,
        selected=selected,
        steps=args.steps,
        batch_size=args.batch_size,
        max_length=args.max_length,
    )


BENCHES = (
    Bench(
        "zo-step",
        "ZO step time and memory vs inference",
        "privzo bench zo-step --device cuda --shape opt-1.3b --dtype float16",
        _zo_step_options,
        _zo_step,
        description="Time and peak memory of a zeroth-order step (DPZero, MeZO, MeZO's "
        "reference step) and its sweeps against two forward passes, with the targets they "
        "are held to.",
        cache_dir=False,
    ),
    Bench(
        "offload",
        "a ZeRO-3 step with its weights offloaded to host memory vs the planner",
        "privzo bench offload --device cuda --shape opt-1.3b --dtype float16",
        _offload_options,
        _offload,
        description="Time and peak memory (the device's and the host's) of a forward, a MeZO "
        "and a DPZero step of a randomly initialised model of a named shape, partitioned by "
        "DeepSpeed ZeRO-3 in a world of one process with its partitions in host memory "
        "(parallel.offload: cpu), beside the planner's GPU peak, host memory and bytes moved "
        "per step for the same shape, dtype, batch and length. Needs DeepSpeed.",
        cache_dir=False,
    ),
    Bench(
        "memory",
        "time and peak memory per step of every algorithm vs inference",
        "privzo bench memory --repeats 3",
        _memory_options,
        _memory,
    ),
    Bench(
        "distributed",
        "step time (single vs 2 replica workers), bytes per step, zero3 memory",
        "privzo bench distributed --steps 30",
        _distributed_options,
        _distributed,
    ),
    Bench(
        "pad-to",
        "CPU time per step with task.pad_to=max_length vs batch",
        "privzo bench pad-to configs/runs/tiny-dpzero.yaml --steps 20",
        _pad_to_options,
        _pad_to,
        description="CPU time per step of a zeroth-order run config with batches of a public "
        "shape (task.pad_to=max_length) and padded to their longest member (batch), side by "
        "side.",
    ),
    Bench(
        "planner",
        "the planner's memory per worker against real-size runs",
        "privzo bench planner --model models/opt-1.3b --output-dir runs/bench-planner",
        _planner_options,
        _planner,
        description="Short MeZO and DPZero runs of a model directory (e.g. privzo models init "
        "--shape opt-1.3b) on CPU, single, replica and zero3 with 2 workers and zero3 "
        "offloaded, in float32 and bfloat16, one at a time: each worker's peak memory beside "
        "the planner's, the step time over two forwards and the projected gradients' agreement "
        "with the single process. Cases finished in the output directory are read, not run "
        "again.",
    ),
)
"""The benchmarks that measure, in the order ``privzo bench --help`` lists them."""


# --- kernels: a check, exit 1 where it fails ---------------------------------------------------


def _add_kernels(benches: Commands) -> None:
    kernels = add_command(
        benches,
        "kernels",
        "the fused kernels on a device against their CPU twin; half-precision update "
        "projection (exit 1 where a check fails)",
        ["privzo bench kernels", "TRITON_INTERPRET=1 privzo bench kernels --device cpu"],
    )
    kernels.add_argument("--device", default="cuda", help="cuda or cpu (under TRITON_INTERPRET=1)")
    kernels.add_argument("--size", type=int, default=1 << 16, help="elements per agreement check")
    kernels.add_argument(
        "--projection-size", type=int, default=1 << 20, help="weights per projection"
    )
    kernels.add_argument("--projection-steps", type=int, default=100, help="updates per projection")
    add_json(kernels)
    kernels.set_defaults(handler=_kernels_command)


def _kernels_command(args: argparse.Namespace) -> int:
    import torch

    from privzo.bench.kernel_check import check_kernels

    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device={args.device!r}: allowed: cpu, cuda")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "--device=cpu: Triton's kernels run on CPU tensors only under its interpreter; "
            "set TRITON_INTERPRET=1"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device=cuda, but this machine (or this torch build) has no CUDA")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else None
    result = check_kernels(
        device or torch.device("cpu"),
        size=args.size,
        projection_size=args.projection_size,
        projection_steps=args.projection_steps,
    )
    _print_result(result, args.json)
    return 0 if result.passed else 1


def _print_result(result: BenchResult, as_json: bool) -> None:
    """A benchmark's result: all of it as JSON, or the table it makes of itself."""
    print(json.dumps(result.to_json(), indent=2) if as_json else result.table())
