"""What a run needs before it starts: ``privzo models init`` (a model directory), ``privzo data
prepare`` (a task's data, offline) and ``privzo plan`` (memory per GPU and the strategy)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from privzo.cli.arguments import (
    DTYPES,
    Commands,
    add_command,
    add_json,
    add_output_dir,
    add_subcommands,
    dtype_name,
    finish_command,
    options_named,
)
from privzo.cli.process import quiet_libraries

if TYPE_CHECKING:
    from privzo.planner import Plan

SHAPE_NAMES = (
    "a named shape (opt-125m ... opt-66b, llama-2-7b/13b/70b, llama-3.1-8b/70b, "
    "qwen2.5-0.5b/7b/72b, mistral-7b), its hub id (e.g. meta-llama/Llama-3.1-8B), or a local "
    "model directory (its config.json)"
)


def add_plan(commands: Commands) -> None:
    planner = add_command(
        commands,
        "plan",
        "memory per GPU and strategy (replica / zero3) for a model's shape",
        "privzo plan --model opt-66b --gpus 8 --gpu-memory-gb 80",
        description="Estimate a zeroth-order run's memory per GPU for a decoder's shape (OPT, "
        "Llama, Mistral, Qwen2, Qwen3), choose the "
        "parallel strategy (replica where the model fits one GPU, else zero3) and say whether "
        "it fits. Loads nothing.",
    )
    planner.add_argument("--model", required=True, help=f"{SHAPE_NAMES}; or all")
    planner.add_argument("--gpus", type=int, required=True, help="GPUs of the run")
    planner.add_argument(
        "--gpu-memory-gb", type=float, required=True, help="memory of one GPU, in GiB"
    )
    planner.add_argument("--dtype", default="float16", help=f"the weights' dtype: {DTYPES}")
    planner.add_argument("--batch-size", type=int, default=16, help="examples per step")
    planner.add_argument("--seq-len", type=int, default=256, help="tokens per example")
    planner.add_argument(
        "--offload",
        choices=("none", "cpu", "nvme"),
        default="none",
        help="where zero3 keeps the partitions (parallel.offload): host memory or NVMe files; "
        "adds the host memory, NVMe bytes and bytes copied per step",
    )
    planner.add_argument(
        "--host-memory-gb", type=float, help="the host's memory in GiB, to judge it (offload)"
    )
    add_json(planner, "one JSON object (a list with --model all)")
    planner.set_defaults(handler=_plan_command)


# the planner's argument names (its refusals start with them) → the options that set them
PLAN_OPTIONS = {
    "gpus": "--gpus",
    "gpu_memory_gb": "--gpu-memory-gb",
    "batch_size": "--batch-size",
    "seq_len": "--seq-len",
    "host_memory_gb": "--host-memory-gb",
}


def _plan_command(args: argparse.Namespace) -> int:
    from privzo.models.shapes import FAMILY_SHAPES, OPT_SHAPES
    from privzo.planner import plan

    names = [*OPT_SHAPES, *FAMILY_SHAPES] if args.model == "all" else [args.model]
    dtype = dtype_name(args.dtype)
    with options_named(PLAN_OPTIONS):
        plans = [
            plan(
                name,
                gpus=args.gpus,
                gpu_memory_gb=args.gpu_memory_gb,
                dtype=dtype,
                batch_size=args.batch_size,
                seq_len=args.seq_len,
                offload=args.offload,
                host_memory_gb=args.host_memory_gb,
            )
            for name in names
        ]
    if args.json:
        records = [item.to_json() for item in plans]
        print(json.dumps(records[0] if len(records) == 1 else records))
    else:
        print("\n".join(_plan_table(plans, args.gpus, args.offload != "none")))
    return 0


def _plan_table(plans: list[Plan], gpus: int, offloaded: bool) -> list[str]:
    """One line per model; offloaded, also the host's GiB (NVMe's), and GiB copied to each GPU
    per step."""
    gib = 2**30
    extra = f"{'host GiB':>10}{'NVMe GiB':>10}{'moved GiB':>11}" if offloaded else ""
    lines = [
        f"{'model':<14}{'parameters':>16}{'strategy':>10}{'GiB/GPU':>10}{extra}  fits ({gpus} GPUs)"
    ]
    for item in plans:
        figures = ""
        if offloaded:
            figures = (
                f"{item.host_bytes / gib:>10.1f}{item.nvme_bytes / gib:>10.1f}"
                f"{item.offload_bytes_per_step / gib:>11.1f}"
            )
        lines.append(
            f"{item.model:<14}{item.parameters:>16,}{item.strategy:>10}"
            f"{item.bytes_per_gpu / gib:>10.1f}{figures}  {'yes' if item.fits else 'NO'}"
        )
    return lines


def add_data(commands: Commands) -> None:
    data = add_command(
        commands,
        "data",
        "task data",
        "privzo data prepare sst2 --output-dir data/sst2",
    )
    data_commands = add_subcommands(data, "data_command")
    prepare = add_command(
        data_commands,
        "prepare",
        "export a task's hub data to local Parquet for offline clusters",
        "privzo data prepare sst2 --output-dir data/sst2",
        description="Download a task preset's data from the Hugging Face Hub (needs "
        "privzo[hub]) and write each split as Parquet, for clusters without the Hub.",
    )
    prepare.add_argument("task", help="a task preset, e.g. sst2, snli, boolq")
    add_output_dir(prepare, "where the splits are written")
    prepare.add_argument("--hf-dataset", help="override the preset's hub id (or a local dir)")
    prepare.add_argument("--hf-subset", help="override the preset's subset")
    prepare.set_defaults(handler=_prepare_command)


def _prepare_command(args: argparse.Namespace) -> int:
    from privzo.tasks.prepare import prepare_task_data

    record = prepare_task_data(
        args.task, args.output_dir, hf_dataset=args.hf_dataset, hf_subset=args.hf_subset
    )
    for name, split in record.splits.items():
        print(f"{name}: {split.rows} rows -> {args.output_dir / split.file}")
    print(f"use it with task.name={args.task} task.data_dir={args.output_dir}")
    return 0


def add_models(commands: Commands) -> None:
    models = add_command(
        commands,
        "models",
        "local model directories",
        "privzo models init --shape tiny --output-dir runs/tiny-model",
    )
    models_commands = add_subcommands(models, "models_command")
    init = add_command(
        models_commands,
        "init",
        "a randomly initialised model of a named shape and privzo's tokenizer, in a directory",
        "privzo models init --shape opt-125m --output-dir models/opt-125m-random",
    )
    init.add_argument(
        "--shape",
        required=True,
        help="tiny (an OPT of 5.32M parameters: 32.3 times the built-in demo-opt-s, and not the "
        f"built-in tiny-opt), {SHAPE_NAMES}",
    )
    add_output_dir(init, "a new or empty directory")
    init.add_argument("--dtype", default="float32", help=f"the weights' dtype: {DTYPES}")
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    finish_command(init, _models_init_command, cache_dir=False)


def _models_init_command(args: argparse.Namespace) -> int:
    from privzo.models.random_init import init_model_directory

    quiet_libraries(args.verbose)
    dtype = dtype_name(args.dtype)
    target = init_model_directory(args.shape, args.output_dir, dtype=dtype, seed=args.seed)
    print(f"random {args.shape} ({dtype}) in {target}; use it with model.name_or_path={target}")
    return 0
