"""The ``privzo`` command: its parser, made of each command family's, and the one place where
errors become exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from privzo.cli import audit, bench, demo, models, privacy, run, study, tune
from privzo.cli.arguments import (
    HelpFormatter,
    add_subcommands,
    all_overrides,
    check_job_output_dir,
    unrecognized,
)
from privzo.cli.process import Terminated, passive_openmp_waits, redeliver_lost_interrupts

DESCRIPTION = (
    "Private fine-tuning of language models without backpropagation (DPZero / DP-ZO, MeZO and "
    "first-order baselines), with privacy accounting, Ray Train / Tune scale-out and MLflow "
    "records. Start with `privzo demo`; `privzo COMMAND --help` describes each command."
)
EPILOG = """examples:
  privzo demo
  privzo check configs/runs/tiny-dpzero.yaml
  privzo run configs/runs/tiny-dpzero.yaml --output-dir runs/tiny-dp

exit codes:
  0    success
  1    privzo bench kernels: a check failed; any command: an unexpected error (a traceback)
  2    a usage or config error, a run refused by its checks, a file or tracking store
       that cannot be read or written (a full disk), a Ray that did not start or lost
       a worker, or a run whose weights became non-finite (the reason on stderr)
  3    privzo study --max-cells: cells remain (the same command continues)
  4    privzo audit, privzo study: PRIVACY VIOLATED (the audit's lower bound exceeds the
       claimed ε)
  130  interrupted (Ctrl+C); privzo tune: the search was interrupted (the same command
       resumes it)
  143  privzo run stopped by SIGTERM (the same command resumes)"""

# In the order `privzo --help` lists them: the run, then what is made of runs, then the tools.
COMMANDS = (
    run.add_run,
    run.add_check,
    tune.add_tune,
    tune.add_export_best,
    study.add_study,
    audit.add_audit,
    study.add_report,
    run.add_replay,
    privacy.add_privacy,
    bench.add_bench,
    models.add_plan,
    models.add_data,
    models.add_models,
    demo.add_demo,
)


def refusal_line(error: Exception) -> str | None:
    """The one line (exit code 2) of an error that ends a command without a traceback: bad
    input, a file or store that cannot be read or written, a Ray that failed, a run whose
    weights overflowed (its message says what to change). None for anything else: a bug,
    which keeps its traceback."""
    refused = isinstance(error, ValueError | OSError)
    if not refused and isinstance(error, RuntimeError):
        from privzo.zo.integrity import NonFiniteWeightsError  # loaded: only a run raises it

        refused = isinstance(error, NonFiniteWeightsError)
    return f"privzo: error: {error}" if refused else None


def build_parser() -> argparse.ArgumentParser:
    from privzo import __version__

    parser = argparse.ArgumentParser(
        prog="privzo", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"privzo {__version__}")
    commands = add_subcommands(parser, "command")
    for add in COMMANDS:
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    passive_openmp_waits()
    redeliver_lost_interrupts()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `privzo run CFG --output-dir D a.b=1`: overrides may also follow the options
    if extra and getattr(args, "overrides", None) is not None and all_overrides(extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(unrecognized(extra, getattr(args, "overrides", None) is not None))
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        check_job_output_dir(getattr(args, "output_dir", None))
        return handler(args)
    except Exception as error:
        line = refusal_line(error)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # one line, not a traceback (`privzo run` says its own)
        print(f"privzo {args.command}: interrupted", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
