"""``privzo`` commands: parse, build, call, print. All logic lives in the library."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path("~/.cache/privzo").expanduser()


def _add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"where built-in models are built and cached (default: {DEFAULT_CACHE})",
    )


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max ..."


def process_cores() -> int:
    """The cores this process may use: its CPU affinity (taskset, a container's cpuset), capped
    by its cgroup's CPU quota; the machine's count where neither can be read."""
    from privzo.threads import available_cores, cgroup_cpu_quota

    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:  # macOS and Windows have no affinity call
        affinity = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_quota(CGROUP_CPU_MAX.read_text())
    except OSError:
        quota = None
    return available_cores(affinity, quota)


def _use_process_cores() -> int:
    """Size torch's pools to the cores available to this one process (a run, a study's cells
    one after another) and return the count."""
    from privzo.threads import use_threads

    cores = process_cores()
    use_threads(cores)
    return cores


def _passive_openmp_waits() -> None:
    """Let torch's OpenMP threads sleep, not spin, while they wait for each other.

    Read once, when torch loads its OpenMP runtime, so this runs before any command imports
    torch; Ray workers started from this process inherit it. Spinning threads of several
    processes on shared cores starve each other: on this project's 2-core machine at load
    average 6 to 8, ten AdamW steps of a demo-opt-s-sized model took 16 to 45 s wall (4 to 9 s
    of CPU) on 2 spinning threads, 2.2 to 3.5 s (0.5 s of CPU) on 2 passive ones and 2.1 to
    2.8 s on one thread. A user's own OMP_WAIT_POLICY wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _quiet_libraries(args: argparse.Namespace) -> None:
    """Keep the console to privzo's progress and tables: silence the libraries' per-load bars,
    info logs and known noise (unless ``--verbose``)."""
    import logging
    import warnings

    if getattr(args, "verbose", False):
        return
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    # mlflow sets its own level when it is imported (lazily, at the first run): tell it first.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # Opacus and peft call this deprecated transformers property on every model they wrap
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    # Tune's automatic loggers add TensorBoard, which is not installed, and say so at every
    # search; a search passes its CSV and JSON loggers itself
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # DeepSpeed (imported by transformers' integrations) warns on every CPU-only machine; its
    # logger's level is set when it is imported, so a filter is what stays
    logging.getLogger("DeepSpeed").addFilter(
        lambda record: "Setting accelerator to CPU" not in record.getMessage()
    )
    # a local cluster turns token auth on by default and says so at every start
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose", action="store_true", help="show the libraries' logs, warnings and bars too"
    )


def _run_command(args: argparse.Namespace) -> int:
    from privzo.config import load_config

    # extra YAML files among the overrides merge over the first config, in order; read before
    # torch and transformers are imported, so a typo is reported in a second, not half a minute
    extra_files = [item for item in args.overrides if "=" not in item]
    overrides = [item for item in args.overrides if "=" in item]
    config = load_config([args.config, *extra_files], overrides)
    _quiet_libraries(args)
    from privzo.run import run

    if config.parallel.strategy == "single":  # Ray Train gives each worker its own CPUs
        _use_process_cores()
    try:
        with _sigterm_as_interrupt():
            summary = run(
                config,
                args.output_dir,
                cache_dir=args.cache_dir,
                progress=not args.quiet,
                overwrite=args.overwrite,
                tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
            )
    except KeyboardInterrupt as stop:  # one line, not the loop's traceback; tracker: KILLED
        print(_interrupted_line(args.output_dir), file=sys.stderr)
        # what a shell reports: 128 + SIGTERM (a job scheduler's stop) or SIGINT (Ctrl+C)
        return 143 if isinstance(stop, Terminated) else 130
    if args.json:  # one line a job's log can be parsed from
        print(json.dumps({"privzo_summary": summary}, default=str))
    else:
        _print_summary(summary, args.output_dir)
    return 0


def _check_command(args: argparse.Namespace) -> int:
    """What ``privzo run`` would do with this config, or why it would refuse (exit 2)."""
    from privzo.config import load_config

    extra_files = [item for item in args.overrides if "=" not in item]
    overrides = [item for item in args.overrides if "=" in item]
    config = load_config([args.config, *extra_files], overrides)  # before torch: fast errors
    _quiet_libraries(args)
    from privzo.preflight import preflight

    checked = preflight(
        config,
        output_dir=args.output_dir,
        overwrite=args.overwrite,
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
    )
    if args.json:
        print(json.dumps({"privzo_check": checked.to_json()}, default=str))
    else:
        print("\n".join(["privzo check: the run can start", *checked.describe()]))
    return 0


def _interrupted_line(output_dir: Path) -> str:
    return (
        f"privzo: interrupted; its MLflow run (if started) is marked KILLED and {output_dir} "
        "keeps the steps made so far: the same command resumes a zeroth-order run from there, "
        "--overwrite starts over"
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or `kill` stopping the job), handled like Ctrl+C."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a run trains, SIGTERM stops it as Ctrl+C does: records kept, MLflow run KILLED."""

    def stop(_signum: int, _frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_summary(summary: dict[str, Any], output_dir: Path) -> None:
    def show(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    keys = (
        "algorithm",
        "accuracy_before",
        "accuracy_after",
        "epsilon",
        "delta",
        "noise_multiplier",
        "accountant",
        "steps",
        "mean_step_time_s",
        "peak_memory_mb",
        "tracking_run_id",
    )
    width = max(len(key) for key in keys)
    for key in keys:
        print(f"{key:<{width}}  {show(summary.get(key))}")
    print(f"results in {output_dir}")


def _replay_command(args: argparse.Namespace) -> int:
    from privzo.replay import replay_to_directory

    _quiet_libraries(args)
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


def _privacy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delta", type=float, required=True)
    parser.add_argument("--sample-rate", type=float, help="Poisson sampling probability p")
    parser.add_argument("--batch-size", type=int, help="expected batch size (with --dataset-size)")
    parser.add_argument("--dataset-size", type=int)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--mechanism", choices=("gaussian", "laplace"), default="gaussian")
    parser.add_argument("--accountant", choices=("pld", "rdp", "pure", "numeric"), default="pld")
    parser.add_argument(
        "--noise-grid",
        type=int,
        help="grid points per σC of discrete noise (a zeroth-order run's privacy.noise_grid, "
        "1024 by default there); omitted: the continuous mechanism",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _noise_parameters(args: argparse.Namespace) -> dict[str, int] | None:
    return None if args.noise_grid is None else {"grid": args.noise_grid}


def _sample_rate(args: argparse.Namespace) -> float:
    if args.sample_rate is not None:
        if args.batch_size is not None or args.dataset_size is not None:
            raise ValueError("give --sample-rate or --batch-size with --dataset-size, not both")
        return args.sample_rate
    if args.batch_size is None or args.dataset_size is None:
        raise ValueError("give --sample-rate P, or --batch-size B with --dataset-size N")
    if args.dataset_size <= 0 or args.batch_size <= 0 or args.batch_size > args.dataset_size:
        raise ValueError(
            f"--batch-size={args.batch_size} --dataset-size={args.dataset_size}: need "
            "0 < batch size ≤ dataset size"
        )
    return args.batch_size / args.dataset_size


def _privacy_report(args: argparse.Namespace, noise_multiplier: float, epsilon: float) -> int:
    record = {
        "noise_multiplier": noise_multiplier,
        "epsilon": epsilon,
        "delta": args.delta,
        "sample_rate": _sample_rate(args),
        "steps": args.steps,
        "mechanism": args.mechanism,
        "accountant": args.accountant,
        "noise_grid": args.noise_grid,
    }
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"noise multiplier σ = {noise_multiplier:.6g} (noise scale σ·C)\n"
            f"ε = {epsilon:.6g} at δ = {args.delta:g} after {args.steps} steps, sample rate "
            f"{record['sample_rate']:.6g} ({_mechanism_label(args)}, {args.accountant} accountant)"
        )
    return 0


def _mechanism_label(args: argparse.Namespace) -> str:
    if args.noise_grid is None:
        return args.mechanism
    return f"discrete {args.mechanism} on a grid of {args.noise_grid} per σC"


def _calibrate_command(args: argparse.Namespace) -> int:
    from privzo.privacy import calibrate_noise_multiplier, compute_epsilon

    common = dict(
        sample_rate=_sample_rate(args),
        steps=args.steps,
        delta=args.delta,
        mechanism=args.mechanism,
        accountant=args.accountant,
        noise_parameters=_noise_parameters(args),
    )
    noise_multiplier = calibrate_noise_multiplier(epsilon=args.epsilon, **common)
    epsilon = compute_epsilon(noise_multiplier=noise_multiplier, **common)
    return _privacy_report(args, noise_multiplier, epsilon)


def _epsilon_command(args: argparse.Namespace) -> int:
    from privzo.privacy import compute_epsilon

    epsilon = compute_epsilon(
        noise_multiplier=args.noise_multiplier,
        sample_rate=_sample_rate(args),
        steps=args.steps,
        delta=args.delta,
        mechanism=args.mechanism,
        accountant=args.accountant,
        noise_parameters=_noise_parameters(args),
    )
    return _privacy_report(args, args.noise_multiplier, epsilon)


def _bench_command(args: argparse.Namespace) -> int:
    from privzo.bench import zo_step_benchmark

    _quiet_libraries(args)
    result = zo_step_benchmark(
        shape=args.shape,
        device=args.device,
        dtype=_DTYPE_ALIASES.get(args.dtype, args.dtype),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        repeats=args.repeats,
        progress=not args.json,
    )
    print(json.dumps(result, indent=2) if args.json else result["table"])
    return 0


def _bench_kernels_command(args: argparse.Namespace) -> int:
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
    print(json.dumps(result.to_json(), indent=2) if args.json else result.table())
    return 0 if result.passed else 1


def _bench_memory_command(args: argparse.Namespace) -> int:
    from privzo.bench_memory import memory_benchmark

    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats}: allowed: 1 or more")
    _quiet_libraries(args)  # the loads' "Loading weights" and "Writing model shards" bars
    result = memory_benchmark(args.cache_dir, repeats=args.repeats, progress=not args.json)
    print(json.dumps(result, indent=2) if args.json else result["table"])
    return 0


def _bench_distributed_command(args: argparse.Namespace) -> int:
    from privzo.bench_distributed import distributed_benchmark

    _quiet_libraries(args)
    # ray.train.report waits on a health check, every 2 s unless told otherwise
    fast_report = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}
    os.environ.update(fast_report)
    # Ray forwards its workers' output to this process's stdout: keep stdout for the result
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = distributed_benchmark(
            args.cache_dir, model=args.model, steps=args.steps, env_vars=fast_report
        )
        import ray

        ray.shutdown()
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
    print(json.dumps(result, indent=2) if args.json else result["table"])
    return 0


def _models_init_command(args: argparse.Namespace) -> int:
    from privzo.models.random_init import init_model_directory

    _quiet_libraries(args)
    dtype = _DTYPE_ALIASES.get(args.dtype, args.dtype)
    target = init_model_directory(args.shape, args.output_dir, dtype=dtype, seed=args.seed)
    print(f"random {args.shape} ({dtype}) in {target}; use it with model.name_or_path={target}")
    return 0


def _prepare_command(args: argparse.Namespace) -> int:
    from privzo.tasks.prepare import prepare_task_data

    record = prepare_task_data(
        args.task, args.output_dir, hf_dataset=args.hf_dataset, hf_subset=args.hf_subset
    )
    for split, info in record["splits"].items():
        print(f"{split}: {info['rows']} rows -> {args.output_dir / info['file']}")
    print(f"use it with task.name={args.task} task.data_dir={args.output_dir}")
    return 0


_DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _plan_command(args: argparse.Namespace) -> int:
    from privzo.planner import OPT_SIZES, plan

    names = list(OPT_SIZES) if args.model == "all" else [args.model]
    dtype = _DTYPE_ALIASES.get(args.dtype, args.dtype)
    plans = [
        plan(
            name,
            gpus=args.gpus,
            gpu_memory_gb=args.gpu_memory_gb,
            dtype=dtype,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
        ).to_json()
        for name in names
    ]
    if args.json:
        print(json.dumps(plans[0] if len(plans) == 1 else plans))
        return 0
    gib = 2**30
    print(
        f"{'model':<10}{'parameters':>14}{'strategy':>10}{'GiB/GPU':>10}  fits ({args.gpus} GPUs)"
    )
    for item in plans:
        print(
            f"{item['model']:<10}{item['parameters']:>14,}{item['strategy']:>10}"
            f"{item['bytes_per_gpu'] / gib:>10.1f}  {'yes' if item['fits'] else 'NO'}"
        )
    return 0


def _tune_command(args: argparse.Namespace) -> int:
    from privzo.tuning import load_search_config, run_search

    _quiet_libraries(args)
    search = load_search_config(args.config, args.overrides)
    # a local Ray schedules trials on the cores this process may use, not the machine's
    local = not (args.address or os.environ.get("RAY_ADDRESS"))
    summary = run_search(
        search,
        args.output_dir,
        cache_dir=args.cache_dir,
        ray_address=args.address,
        num_cpus=process_cores() if local else None,
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
        progress=not args.quiet,
    )
    return 130 if summary["interrupted"] else 0


def _export_best_command(args: argparse.Namespace) -> int:
    from privzo.tuning.export import export_best

    summary = export_best(args.search_dir, args.output_dir)
    print(f"exported the best trial of {args.search_dir} to {args.output_dir}")
    if summary.get("guarantee"):
        print(f"privacy: {summary['guarantee']}")
    return 0


def _study_command(args: argparse.Namespace) -> int:
    from privzo.studies import load_study_config, run_study

    _quiet_libraries(args)
    study = load_study_config(args.config, args.overrides)
    _use_process_cores()  # cells train one after another in this process
    options: dict[str, Any] = {
        "cache_dir": args.cache_dir,
        "tracking_uri": os.environ.get("MLFLOW_TRACKING_URI") or None,
        "progress": not args.quiet,
    }
    if args.max_cells is not None:
        options["max_cells"] = args.max_cells
    summary = run_study(study, args.output_dir, **options)
    violated = [name for name, a in summary.get("audits", {}).items() if a["verdict"] == "VIOLATED"]
    if violated:
        from privzo.audit import VIOLATED_EXIT_CODE

        print(f"privzo: PRIVACY VIOLATED in audit cells {violated}", file=sys.stderr)
        return VIOLATED_EXIT_CODE
    return 0 if summary.get("complete", True) else 3


def _audit_command(args: argparse.Namespace) -> int:
    from privzo.audit import VIOLATED_EXIT_CODE, AuditConfig, run_audit
    from privzo.config import load_config, validate_section

    _quiet_libraries(args)
    extra_files = [item for item in args.overrides if "=" not in item]
    overrides = [item for item in args.overrides if "=" in item]
    config = load_config([args.config, *extra_files], overrides)
    options = {
        "canaries": args.canaries,
        "alpha": args.alpha,
        "ks": args.k or None,
        "scores": args.score or None,
    }
    audit = validate_section(AuditConfig, options, "privzo audit")
    _use_process_cores()
    record = run_audit(
        config,
        audit,
        args.output_dir,
        cache_dir=args.cache_dir,
        progress=not args.quiet,
        overwrite=args.overwrite,
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
    )
    print(json.dumps({"privzo_audit": record}) if args.json else _audit_lines(record))
    if record["verdict"] == "VIOLATED":
        print(
            f"privzo: PRIVACY VIOLATED: the audit proves ε ≥ {record['epsilon_lower_bound']:.3f} "
            f"at {1 - record['alpha']:.0%} confidence, above the claimed "
            f"ε = {record['epsilon_claimed']:.3f}: the run is NOT "
            f"({record['epsilon_claimed']:.3g}, {record['delta']:g})-DP as recorded",
            file=sys.stderr,
        )
        return VIOLATED_EXIT_CODE
    return 0


def _audit_lines(record: dict[str, Any]) -> str:
    best = record["best"]
    claimed = record["epsilon_claimed"]
    lines = [
        f"verdict              {record['verdict']}",
        f"epsilon claimed      {'-' if claimed is None else f'{claimed:.3f}'}",
        f"epsilon lower bound  {record['epsilon_lower_bound']:.3f} "
        f"({1 - record['alpha']:.0%} confidence, delta {record['delta']:g})",
        f"best guesses         {best['score']}, k = {best['k']}: {best['correct']} of "
        f"{best['guesses']} right",
        f"canaries             {record['canaries']} ({record['tests']} tests, Bonferroni)",
    ]
    if claimed is None:
        lines.append("(not private: the lower bound is the run's empirical leakage)")
    elif record["tightness"] is not None:
        lines.append(f"tightness            ε_lb / ε = {record['tightness']:.3f}")
    if record["note"]:
        lines.append(f"note: {record['note']}")
    return "\n".join(lines)


def _report_command(args: argparse.Namespace) -> int:
    from privzo.analysis import build_report

    _quiet_libraries(args)
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError(
            "give --tracking-uri (e.g. sqlite:///runs/study/mlflow.db) or set MLFLOW_TRACKING_URI"
        )
    build_report(uri, args.experiment, args.output_dir, study=args.study)
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from privzo.demo import run_demo

    _quiet_libraries(args)
    run_demo(
        args.output_dir,
        cache_dir=args.cache_dir,
        quick=args.quick,
        arms_only=args.arms_only,
        cores=process_cores(),
    )
    return 0


DESCRIPTION = (
    "Private fine-tuning of language models without backpropagation (DPZero / DP-ZO, MeZO and "
    "first-order baselines), with privacy accounting, Ray Train / Tune scale-out and MLflow "
    "records. Start with `privzo demo`; `privzo COMMAND --help` describes each command."
)
RUN_EPILOG = """examples:
  privzo run configs/runs/tiny-dpzero.yaml --output-dir runs/tiny-dp
  privzo run configs/runs/tiny-dpzero.yaml optimizer.steps=800 privacy.epsilon=4 --output-dir runs/x

The output directory receives config.yaml, summary.json, privacy.json and (zeroth-order
algorithms) trajectory.parquet."""


def build_parser() -> argparse.ArgumentParser:
    from privzo import __version__

    parser = argparse.ArgumentParser(prog="privzo", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"privzo {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="one fine-tuning run",
        description="Fine-tune, evaluate and record one run.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("config", type=Path, help="a run config (YAML), e.g. configs/runs/*.yaml")
    run.add_argument(
        "overrides",
        nargs="*",
        help="more config files to merge, then key.sub=value overrides (e.g. optimizer.steps=800)",
    )
    run.add_argument(
        "--output-dir",
        type=Path,
        required=True,
        help="the run's directory: refused if it holds another run (see --overwrite)",
    )
    run.add_argument("--overwrite", action="store_true", help="replace a finished run's records")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--json",
        action="store_true",
        help='print the summary as one JSON line, {"privzo_summary": {...}}',
    )
    _add_cache_dir(run)
    _add_verbose(run)
    run.set_defaults(handler=_run_command)

    check = commands.add_parser(
        "check",
        help="what a run of CONFIG would do (σ, ε, steps, layout, memory), or why it cannot start",
        description="Run every check `privzo run` makes before it loads weights (preflight) "
        "and print what the run would do; exit 0, or 2 with the reason. Loads no weights and "
        "writes nothing.",
    )
    check.add_argument("config", type=Path, help="a run config (YAML), e.g. configs/runs/*.yaml")
    check.add_argument(
        "overrides", nargs="*", help="more config files to merge, then key.sub=value overrides"
    )
    check.add_argument(
        "--output-dir", type=Path, help="also check this run directory is free (see --overwrite)"
    )
    check.add_argument("--overwrite", action="store_true", help="as privzo run's --overwrite")
    check.add_argument("--json", action="store_true", help='one JSON line, {"privzo_check": ...}')
    _add_verbose(check)
    check.set_defaults(handler=_check_command)

    tune = commands.add_parser(
        "tune", help="a Ray Tune search under a fixed privacy budget (resumes in the same dir)"
    )
    tune.add_argument("config", type=Path, help="a search config (YAML), e.g. configs/searches/")
    tune.add_argument("overrides", nargs="*", help="key.sub=value overrides of the search config")
    tune.add_argument("--output-dir", type=Path, required=True)
    tune.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or local)")
    tune.add_argument("--quiet", action="store_true", help="no Tune progress table")
    _add_cache_dir(tune)
    _add_verbose(tune)
    tune.set_defaults(handler=_tune_command)

    export = commands.add_parser(
        "export-best",
        help="the best trial of a finished search, alone (its config, trajectory, summary)",
    )
    export.add_argument("search_dir", type=Path, help="a finished search's --output-dir")
    export.add_argument("--output-dir", type=Path, required=True, help="a new, empty directory")
    export.set_defaults(handler=_export_best_command)

    study = commands.add_parser(
        "study", help="a study (e.g. scaling over model sizes); resumes in the same dir"
    )
    study.add_argument("config", type=Path, help="a study config (YAML), e.g. configs/studies/")
    study.add_argument("overrides", nargs="*", help="key.sub=value overrides of the study config")
    study.add_argument("--output-dir", type=Path, required=True)
    study.add_argument("--max-cells", type=int, help="train at most this many cells now")
    study.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_cache_dir(study)
    _add_verbose(study)
    study.set_defaults(handler=_study_command)

    audit = commands.add_parser(
        "audit",
        help="test a run's (ε, δ) claim with canaries and one training run",
        description="Train CONFIG once with M canaries, each in the private training set by a "
        "secret fair coin; score, guess and report an ε lower bound at confidence 1 − alpha "
        "(Steinke, Nasr and Jagielski 2023). Exit code 4 when it exceeds the claimed ε.",
    )
    audit.add_argument("config", type=Path, help="a run config (YAML)")
    audit.add_argument("overrides", nargs="*", help="more config files, then key.sub=value")
    audit.add_argument("--canaries", type=int, default=1000, help="M (default 1000)")
    audit.add_argument("--alpha", type=float, default=0.05, help="1 − confidence (default 0.05)")
    audit.add_argument(
        "--k", type=int, action="append", help="guesses per side (repeat; default: a sweep)"
    )
    audit.add_argument(
        "--score",
        action="append",
        help="a score to guess from (repeat; default: every score the algorithm allows): "
        "black-box, white-box-correlation, white-box-likelihood, white-box-match",
    )
    audit.add_argument("--output-dir", type=Path, required=True)
    audit.add_argument("--overwrite", action="store_true", help="replace a finished audit")
    audit.add_argument("--quiet", action="store_true", help="no progress bar")
    audit.add_argument("--json", action="store_true", help='print {"privzo_audit": {...}}')
    _add_cache_dir(audit)
    _add_verbose(audit)
    audit.set_defaults(handler=_audit_command)

    report = commands.add_parser("report", help="scaling tables, plots and a report from MLflow")
    report.add_argument("--experiment", required=True, help="the MLflow experiment name")
    report.add_argument("--output-dir", type=Path, required=True)
    report.add_argument("--study", help="only this study's runs (its cells)")
    report.add_argument("--tracking-uri", help="default: MLFLOW_TRACKING_URI")
    report.set_defaults(handler=_report_command)

    replay = commands.add_parser("replay", help="rebuild fine-tuned weights from a trajectory")
    replay.add_argument("--base", required=True, help="base model: built-in name, dir or hub id")
    replay.add_argument("--trajectory", type=Path, required=True)
    replay.add_argument("--output-dir", type=Path, required=True)
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
    _add_cache_dir(replay)
    _add_verbose(replay)
    replay.set_defaults(handler=_replay_command)

    privacy = commands.add_parser("privacy", help="privacy accounting")
    privacy_commands = privacy.add_subparsers(dest="privacy_command", required=True)
    calibrate = privacy_commands.add_parser("calibrate", help="σ for a target (ε, δ)")
    calibrate.add_argument("--epsilon", type=float, required=True)
    _privacy_arguments(calibrate)
    calibrate.set_defaults(handler=_calibrate_command)
    epsilon = privacy_commands.add_parser("epsilon", help="ε spent at a given σ")
    epsilon.add_argument("--noise-multiplier", type=float, required=True)
    _privacy_arguments(epsilon)
    epsilon.set_defaults(handler=_epsilon_command)

    bench = commands.add_parser("bench", help="benchmarks that print measured ratios")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    zo_step = bench_commands.add_parser("zo-step", help="ZO step time and memory vs inference")
    zo_step.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    zo_step.add_argument(
        "--shape", default="tiny", help="tiny (5.3M, the default), opt-125m, ... opt-66b"
    )
    zo_step.add_argument("--dtype", default="float32", help="float32 / bfloat16 / float16")
    zo_step.add_argument("--batch-size", type=int, default=16)
    zo_step.add_argument("--seq-len", type=int, default=128)
    zo_step.add_argument("--json", action="store_true", help="print one JSON object")
    zo_step.add_argument("--repeats", type=int, default=5)
    _add_verbose(zo_step)
    zo_step.set_defaults(handler=_bench_command)
    kernel_check = bench_commands.add_parser(
        "kernels",
        help="the fused kernels on a device against their CPU twin; half-precision update "
        "projection (exit 1 where a check fails)",
    )
    kernel_check.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    kernel_check.add_argument(
        "--size", type=int, default=1 << 16, help="elements per agreement check"
    )
    kernel_check.add_argument(
        "--projection-size", type=int, default=1 << 20, help="weights per projection"
    )
    kernel_check.add_argument("--projection-steps", type=int, default=100)
    kernel_check.add_argument("--json", action="store_true", help="print one JSON object")
    kernel_check.set_defaults(handler=_bench_kernels_command)
    memory = bench_commands.add_parser(
        "memory", help="time and peak memory per step of every algorithm vs inference"
    )
    memory.add_argument("--json", action="store_true")
    memory.add_argument("--repeats", type=int, default=3)
    _add_cache_dir(memory)
    _add_verbose(memory)
    memory.set_defaults(handler=_bench_memory_command)
    distributed = bench_commands.add_parser(
        "distributed", help="replica step time (1 vs 2 workers), bytes per step, zero3 memory"
    )
    distributed.add_argument("--json", action="store_true")
    distributed.add_argument("--model", default="demo-opt-s", help="a built-in model or path")
    distributed.add_argument("--steps", type=int, default=30)
    _add_cache_dir(distributed)
    _add_verbose(distributed)
    distributed.set_defaults(handler=_bench_distributed_command)

    planner = commands.add_parser(
        "plan", help="memory per GPU and strategy (replica / zero3) for an OPT size"
    )
    planner.add_argument("--model", required=True, help="opt-125m ... opt-66b, or all")
    planner.add_argument("--gpus", type=int, required=True)
    planner.add_argument("--gpu-memory-gb", type=float, required=True)
    planner.add_argument("--dtype", default="float16", help="float16 / bfloat16 / float32")
    planner.add_argument("--batch-size", type=int, default=16)
    planner.add_argument("--seq-len", type=int, default=256)
    planner.add_argument("--json", action="store_true")
    planner.set_defaults(handler=_plan_command)

    data = commands.add_parser("data", help="task data")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    prepare = data_commands.add_parser(
        "prepare", help="export a task's hub data to local Parquet for offline clusters"
    )
    prepare.add_argument("task", help="a task preset, e.g. sst2, snli, boolq")
    prepare.add_argument("--output-dir", type=Path, required=True)
    prepare.add_argument("--hf-dataset", help="override the preset's hub id (or a local dir)")
    prepare.add_argument("--hf-subset", help="override the preset's subset")
    prepare.set_defaults(handler=_prepare_command)

    models = commands.add_parser("models", help="local model directories")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    init = models_commands.add_parser(
        "init",
        help="a randomly initialised OPT-shaped model and privzo's tokenizer, saved to a directory",
    )
    init.add_argument("--shape", required=True, help="tiny, opt-125m, opt-350m, ... opt-66b")
    init.add_argument("--output-dir", type=Path, required=True, help="a new or empty directory")
    init.add_argument("--dtype", default="float32", help="float32 / bfloat16 / float16")
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    _add_verbose(init)
    init.set_defaults(handler=_models_init_command)

    demo = commands.add_parser("demo", help="the embedded offline demo (zero-shot vs DP vs MeZO)")
    demo.add_argument("--output-dir", type=Path, default=Path("runs/demo"))
    demo.add_argument("--quick", action="store_true", help="fewer steps (for smoke tests)")
    demo.add_argument(
        "--arms-only", action="store_true", help="skip the small search and the scaling study"
    )
    _add_cache_dir(demo)
    _add_verbose(demo)
    demo.set_defaults(handler=_demo_command)
    return parser


def _all_overrides(items: list[str]) -> bool:
    return all("=" in item and not item.startswith("-") for item in items)


def main(argv: Sequence[str] | None = None) -> int:
    _passive_openmp_waits()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `privzo run CFG --output-dir D a.b=1`: overrides may also follow the options
    if extra and getattr(args, "overrides", None) is not None and _all_overrides(extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (ValueError, OSError) as error:
        print(f"privzo: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
