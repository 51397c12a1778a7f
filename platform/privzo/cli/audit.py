"""``privzo audit``: a run's (ε, δ) claim tested with canaries and one training run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from privzo.cli.arguments import (
    Commands,
    add_command,
    add_config,
    add_json,
    add_output_dir,
    finish_command,
    load_run_config,
    work_options,
)
from privzo.cli.process import quiet_libraries, use_process_cores

if TYPE_CHECKING:
    from privzo.audit import AuditRecord

SCORES = (
    "black-box, white-box-directional, white-box-correlation, white-box-likelihood, white-box-match"
)


def add_audit(commands: Commands) -> None:
    audit = add_command(
        commands,
        "audit",
        "test a run's (ε, δ) claim with canaries and one training run",
        "privzo audit configs/runs/tiny-dpzero.yaml privacy.epsilon=8 --canaries 1000 "
        "--output-dir runs/audit-dp8",
        description="Train CONFIG once with M canaries, each in the private training set by a "
        "secret fair coin; score, guess and report an ε lower bound at confidence 1 − alpha "
        "(Steinke, Nasr and Jagielski 2023). Exit code 4 when it exceeds the claimed ε.",
    )
    add_config(audit, "run", "configs/runs/*.yaml")
    audit.add_argument("--canaries", type=int, default=1000, help="M, the number of canaries")
    audit.add_argument("--alpha", type=float, default=0.05, help="1 − confidence")
    audit.add_argument(
        "--k", type=int, action="append", help="guesses per side (repeat; default: a sweep)"
    )
    audit.add_argument(
        "--score",
        action="append",
        help="a score to guess from, fixed before the run (repeat; default: "
        f"white-box-directional, or black-box without a trajectory): {SCORES}",
    )
    audit.add_argument(
        "--canary-design",
        choices=("random-words", "large-gradient"),
        help="how the canaries are made, fixed before the run (default: random-words): random "
        "vocabulary words and labels, or the base model's loudest words labelled against it",
    )
    add_output_dir(audit, "the audit's directory (its run)", overwrite="replace a finished audit")
    add_json(audit, '{"privzo_audit": {...}}')
    finish_command(audit, _audit_command, quiet="no progress bar")


# the audit settings' fields → the options that set them (what a refusal names)
AUDIT_OPTIONS = {
    "canaries": "--canaries",
    "alpha": "--alpha",
    "ks": "--k",
    "scores": "--score",
    "canary_design": "--canary-design",
}


def _audit_command(args: argparse.Namespace) -> int:
    from privzo.audit import AuditConfig, run_audit
    from privzo.config.loading import validate_section

    quiet_libraries(args.verbose)
    config = load_run_config(args)
    options = {
        "canaries": args.canaries,
        "alpha": args.alpha,
        "ks": args.k or None,
        "scores": args.score or None,
    }
    if args.canary_design is not None:
        options["canary_design"] = args.canary_design
    audit = validate_section(AuditConfig, options, "privzo audit", AUDIT_OPTIONS)
    use_process_cores()
    record = run_audit(
        config, audit, args.output_dir, overwrite=args.overwrite, **work_options(args)
    )
    return report_audit(record, as_json=args.json)


def report_audit(record: AuditRecord, *, as_json: bool) -> int:
    """Print the audit (its lines, or one JSON object) and return the command's exit code: a
    VIOLATED verdict is also said on stderr and exits with its own code, so scripts see it."""
    from privzo.audit import VIOLATED_EXIT_CODE

    lines = [json.dumps({"privzo_audit": record.to_dict()})] if as_json else record.lines()
    print("\n".join(lines))
    if record.violated:
        print(record.violation_line(), file=sys.stderr)
        return VIOLATED_EXIT_CODE
    return 0
