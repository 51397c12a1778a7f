"""``privzo run``, ``privzo check`` and ``privzo replay``: one run, what it would do, and its
weights rebuilt from its trajectory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from privzo.cli.arguments import (
    Commands,
    add_command,
    add_config,
    add_json,
    add_output_dir,
    finish_command,
    load_run_config,
    path_argument,
    ray_target,
    tracking_uri,
    work_options,
)
from privzo.cli.process import (
    Terminated,
    quiet_libraries,
    sigterm_as_interrupt,
    use_process_cores,
)
from privzo.section import ConfigError

if TYPE_CHECKING:
    from privzo.config.run import RunConfig
    from privzo.preflight import Preflight

RUN_EPILOG = (
    "The output directory receives config.yaml, summary.json, privacy.json, trajectory.parquet "
    "(zeroth-order algorithms) or model/ (dpsgd, adamw, dpgd-0th; any run with save_model=true), "
    "and resume.json until its MLflow run is final; every file: docs/reference/files.md."
)


def add_run(commands: Commands) -> None:
    run = add_command(
        commands,
        "run",
        "one fine-tuning run",
        [
            "privzo run configs/runs/tiny-dpzero.yaml --output-dir runs/tiny-dp",
            "privzo run configs/runs/tiny-dpzero.yaml optimizer.steps=800 privacy.epsilon=4 "
            "--output-dir runs/x",
        ],
        description="Fine-tune, evaluate and record one run.",
    )
    run.epilog = f"{run.epilog}\n\n{RUN_EPILOG}"
    add_config(run, "run", "configs/runs/*.yaml")
    add_output_dir(
        run,
        "the run's directory: refused if it holds another run (see --overwrite)",
        overwrite="replace a finished run's records",
    )
    add_json(run, 'the summary as one JSON line, {"privzo_summary": {...}}')
    finish_command(run, _run_command, quiet="no progress bar", address=True)


def _run_command(args: argparse.Namespace) -> int:
    config = load_run_config(args)
    quiet_libraries(args.verbose)
    from privzo.run import run

    if config.parallel.strategy == "single":  # Ray Train gives each worker its own CPUs
        if args.address is not None:
            raise ConfigError(
                "--address: parallel.strategy='single' runs in this process, on no Ray; "
                "choose a distributed layout (parallel.strategy 'replica' or 'zero3')"
            )
        use_process_cores()
    try:
        with sigterm_as_interrupt():
            summary = run(
                config,
                args.output_dir,
                overwrite=args.overwrite,
                on_checked=print_data_lines,
                cluster=ray_target(args.address),
                **work_options(args),
            )
    except KeyboardInterrupt as stop:  # one line, not the loop's traceback; tracker: KILLED
        print(interrupted_line(config, args.output_dir), file=sys.stderr)
        # what a shell reports: 128 + SIGTERM (a job scheduler's stop) or SIGINT (Ctrl+C)
        return 143 if isinstance(stop, Terminated) else 130
    if args.json:  # one line a job's log can be parsed from
        print(json.dumps({"privzo_summary": summary.to_dict()}, default=str))
    else:
        print("\n".join(summary.lines(args.output_dir)))
    return 0


def print_data_lines(checked: Preflight) -> None:
    """A run's first lines: which rows it trains on (on stderr, beside the progress bar, so
    stdout keeps only the result)."""
    print("\n".join(checked.data_lines()), file=sys.stderr, flush=True)


def interrupted_line(config: RunConfig, output_dir: Path) -> str:
    """What an interrupted ``privzo run`` says: what the same command will do with what
    ``output_dir`` holds (its steps resumed, the run started again where it kept none, as a
    first-order run, which keeps no trajectory, always does, or a finished run's MLflow run
    ended)."""
    head = "privzo: interrupted; its MLflow run (if started) is marked KILLED"
    try:
        return f"{head}; {output_dir} {_what_the_same_command_does(config, output_dir)}"
    except Exception:  # the interrupt is the news; the rerun's checks name a damaged record
        return (
            f"{head} and {output_dir} keeps what the run made: the same command resumes it, or "
            "starts it again where it kept no step; --overwrite starts over"
        )


def _what_the_same_command_does(config: RunConfig, output_dir: Path) -> str:
    from privzo.rundir import unfinished_steps, untracked

    if untracked(output_dir, config) is not None:
        return "holds the finished run: the same command ends its MLflow run, training nothing"
    kept = unfinished_steps(config, output_dir)
    if kept == 0:
        return (
            "kept no step yet (a first-order run keeps none before it ends): the same command "
            "starts the run again from step 0"
        )
    return (
        f"keeps its {kept} released steps: the same command resumes from there; --overwrite "
        "starts over"
    )


def add_check(commands: Commands) -> None:
    check = add_command(
        commands,
        "check",
        "what a run of CONFIG would do (σ, ε, steps, layout, memory), or why it cannot start",
        "privzo check configs/runs/tiny-dpzero.yaml privacy.epsilon=4",
        description="Run every check `privzo run` makes before it loads weights (preflight) "
        "and print what the run would do; exit 0, or 2 with the reason. Loads no weights and "
        "writes nothing.",
    )
    add_config(check, "run", "configs/runs/*.yaml")
    add_output_dir(
        check,
        "also check this run directory is free (see --overwrite)",
        overwrite="as privzo run's --overwrite",
        required=False,
    )
    add_json(check, 'one JSON line, {"privzo_check": ...}')
    finish_command(check, _check_command, cache_dir=False)


def _check_command(args: argparse.Namespace) -> int:
    """What ``privzo run`` would do with this config, or why it would refuse (exit 2)."""
    config = load_run_config(args)
    quiet_libraries(args.verbose)
    from privzo.preflight import preflight

    checked = preflight(
        config,
        output_dir=args.output_dir,
        overwrite=args.overwrite,
        tracking_uri=tracking_uri(),
    )
    if args.json:
        print(json.dumps({"privzo_check": checked.to_json()}, default=str))
    else:
        print("\n".join(["privzo check: the run can start", *checked.describe()]))
    return 0


def add_replay(commands: Commands) -> None:
    replay = add_command(
        commands,
        "replay",
        "rebuild fine-tuned weights from a trajectory",
        "privzo replay --base demo-opt-s --trajectory runs/tiny-dp/trajectory.parquet "
        "--output-dir runs/tiny-dp/rebuilt",
        description="Replay a zeroth-order run's trajectory (its seeds and projected gradients) "
        "onto the base weights it started from, and save the fine-tuned model.",
    )
    replay.add_argument("--base", required=True, help="base model: built-in name, dir or hub id")
    replay.add_argument(
        "--trajectory", type=path_argument, required=True, help="a run's trajectory.parquet"
    )
    add_output_dir(replay, "where the rebuilt weights are saved")
    replay.add_argument(
        "--device",
        help="where to replay (cpu, cuda, cuda:N; default: the training run's device type); "
        "philox trajectories replay on any device",
    )
    replay.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="weights' dtype (default: the training run's); float32 rebuilds a half-precision "
        "run's intended model, its updates without their roundings",
    )
    finish_command(replay, _replay_command)


def _replay_command(args: argparse.Namespace) -> int:
    from privzo.replay import replay_to_directory

    quiet_libraries(args.verbose)
    steps = replay_to_directory(
        args.base,
        args.trajectory,
        args.output_dir,
        cache_dir=args.cache_dir,
        device=args.device,
        dtype=args.dtype,
    )
    print(f"replayed {steps} steps onto {args.base}; weights saved to {args.output_dir}")
    return 0
