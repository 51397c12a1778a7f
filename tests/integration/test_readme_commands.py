"""The command tour's commands, run as written, so the docs and the code cannot drift.

The commands are read from the docs' command tour (docs/guides/commands.md), which the README
links to. Each runs in a fresh directory holding a copy of ``configs/`` (the page's paths are
relative to a checkout), with small sizes appended through the overrides and options the docs
document, and the session's model cache (each built-in model is built once per test session);
the test checks the exit code and what each command writes or prints. Each command runs in a
fresh process forked from one that imported privzo's libraries once (``forked_cli``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from forked_cli import run_cli

pytestmark = pytest.mark.integration

COMMANDS_PAGE = REPO / "docs" / "guides" / "commands.md"
NEEDS_HUB = "Hugging Face Hub"  # the tour's comment on a command that needs the network
# Smaller sizes appended to a command (by its leading words): only overrides / options the docs
# document for that command, so the command as written still decides what runs.
SHRINK = {
    "privzo run": ["optimizer.steps=20"],
    "privzo audit": ["optimizer.steps=20", "--canaries", "100"],
    "privzo tune": ["trials.count=1", "space.optimizer.steps=[20]"],
    "privzo study configs/studies/tiny-scaling.yaml": [
        "models=[demo-opt-s]",
        "overrides.optimizer.steps=20",
    ],
    "privzo study configs/studies/synthetic-quadratic.yaml": [
        "dimensions=[20]",
        "patterns=[rank-d]",
        "seeds=[0]",
        "steps=50",
    ],
    "privzo bench zo-step": ["--repeats", "1"],
    "privzo bench memory": ["--repeats", "1", "--json"],
    "privzo bench distributed": ["--steps", "4", "--model", "tiny-opt", "--json"],
}
# commands that build or cache models take the test's own cache
CACHED = (
    "privzo run",
    "privzo audit",
    "privzo replay",
    "privzo tune",
    "privzo study",
    "privzo bench memory",
    "privzo bench distributed",
)


def readme_commands() -> list[tuple[str, str]]:
    """(command, its comment) for each line of the command tour's first bash block."""
    text = COMMANDS_PAGE.read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        command, _, comment = line.partition("#")
        if command.strip():
            commands.append((command.strip(), comment.strip()))
    return commands


def _output_dir(words: list[str], cwd: Path) -> Path:
    return cwd / words[words.index("--output-dir") + 1]


def _wrote(*names: str) -> Callable[[list[str], Path, str], None]:
    def check(words: list[str], cwd: Path, stdout: str) -> None:
        for name in names:
            assert (_output_dir(words, cwd) / name).is_file(), f"no {name}"

    return check


def _printed(*fragments: str) -> Callable[[list[str], Path, str], None]:
    def check(words: list[str], cwd: Path, stdout: str) -> None:
        for fragment in fragments:
            assert fragment in stdout, f"{fragment!r} not printed"

    return check


def _epsilon_json(words: list[str], cwd: Path, stdout: str) -> None:
    assert json.loads(stdout.strip().splitlines()[-1])["epsilon"] > 0


def _run_record(words: list[str], cwd: Path, stdout: str) -> None:
    output = _output_dir(words, cwd)
    _wrote("summary.json", "config.yaml")(words, cwd, stdout)
    # zeroth-order runs write their trajectory; first-order (DP-SGD) ones their weights instead
    assert (output / "trajectory.parquet").is_file() or (output / "model").is_dir()
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == 20 and 0 <= summary["metric_after"] <= 1


def _bench_memory(words: list[str], cwd: Path, stdout: str) -> None:
    """Every algorithm's step and forward measured; what each one holds beyond inference."""
    from privzo.bench.memory import CASES

    result = json.loads(stdout)  # the children print nothing to stdout
    cases = result["cases"]
    assert list(cases) == [label for label, _, _ in CASES]
    for case in cases.values():
        assert case["step_seconds"] > 0 and case["forward_seconds"] > 0
        assert case["step_peak_mb"] > 0 and case["forward_peak_mb"] > 0
    full = result["model"]["parameters"]
    assert cases["dpgd-0th"]["trainable_parameters"] == full
    # DPGD-0th holds a d-dimensional fp32 noise vector; DPZero noises one scalar
    assert cases["dpgd-0th"]["step_extra_mb"] >= 0.8 * full * 4 / 2**20
    assert cases["dpsgd-full"]["step_extra_mb"] > cases["dpzero"]["step_extra_mb"]
    assert cases["dpsgd-lora"]["trainable_parameters"] < full
    assert "dpzero" in result["table"] and "dpsgd-bitfit" in result["table"]


def _parameters(words: list[str]) -> int:
    """The parameter count of the built-in model a command names, from the command's cache."""
    from transformers import AutoModelForCausalLM

    from privzo.models.builtin import materialize_builtin

    model = words[words.index("--model") + 1]
    cache = Path(words[words.index("--cache-dir") + 1])
    loaded = AutoModelForCausalLM.from_pretrained(materialize_builtin(model, cache, progress=False))
    return sum(parameter.numel() for parameter in loaded.parameters())


def _bench_distributed(words: list[str], cwd: Path, stdout: str) -> None:
    """The layouts' figures for tiny-opt: the all-reduced payload, zero3's partition."""
    result = json.loads(stdout)
    assert result["allreduce_bytes_per_step"] == 16  # [noisy clipped sum, count] in fp64
    assert set(result["step_time_s"]) == {"single", "replica_2"}
    assert all(t > 0 for t in result["step_time_s"].values())
    full = result["zero3_parameter_bytes_full"]
    assert full == 4 * _parameters(words)  # tiny-opt's float32 weights
    # two ranks hold about half each (the last rank's partition may be short of padding)
    assert sum(result["zero3_parameter_bytes_per_rank"]) == full
    assert all(0.45 < fraction <= 0.55 for fraction in result["zero3_fraction_per_rank"])
    assert "replica step time, 2 workers" in result["table"] and "single process" in result["table"]


CHECKS = {
    "privzo check": _printed("privzo check: the run can start", "σ = ", "ε target 4"),
    "privzo run": _run_record,
    "privzo replay": _wrote("config.json"),
    "privzo models init": _wrote("config.json", "model.safetensors", "tokenizer.json"),
    "privzo audit": _wrote("audit.json", "audit_scores.png", "run/summary.json"),
    "privzo privacy calibrate": _printed("noise multiplier σ"),
    "privzo privacy epsilon": _epsilon_json,
    "privzo tune": _wrote("search_summary.json", "trials.parquet"),
    "privzo export-best": _wrote("summary.json", "config.yaml", "trajectory.parquet"),
    "privzo study configs/studies/tiny-scaling.yaml": _wrote("report/report.md"),
    "privzo study configs/studies/synthetic-quadratic.yaml": _wrote("synthetic_summary.json"),
    "privzo report": _wrote("report.md"),
    "privzo bench zo-step": _printed("ZO step benchmark", "dpzero"),
    "privzo bench memory": _bench_memory,
    "privzo bench distributed": _bench_distributed,
    "privzo plan": _printed("opt-66b"),
}


def _starts_with(command: str, words: str) -> bool:
    return command == words or command.startswith(words + " ")


def _matching(table: dict[str, object], command: str) -> object | None:
    """The entry whose key is the longest leading part of ``command``."""
    keys = [key for key in table if _starts_with(command, key)]
    return table[max(keys, key=len)] if keys else None


def test_every_readme_command_is_checked_or_explicitly_needs_the_hub():
    commands = readme_commands()
    assert len(commands) >= 15, "the command tour's block was not found where expected"
    for command, comment in commands:
        assert command.startswith("privzo "), command
        assert NEEDS_HUB in comment or _matching(CHECKS, command) is not None, (
            f"add a check for the documented command {command!r}"
        )


def _words(command: str, cwd: Path, cache_dir: Path) -> list[str]:
    words = shlex.split(command.replace("$PWD", str(cwd)))
    words += _matching(SHRINK, command) or []
    if any(_starts_with(command, key) for key in CACHED):
        words += ["--cache-dir", str(cache_dir)]
    return words


@dataclass(frozen=True)
class Tour:
    """The directory the tour's commands share (a checkout's ``configs/``, and what earlier
    commands wrote, which later ones read), a user's environment and the session's cache."""

    cwd: Path
    env: dict[str, str]
    cache_dir: Path


@pytest.fixture(scope="module")
def tour(tmp_path_factory, cache_dir) -> Tour:
    cwd = tmp_path_factory.mktemp("tour")
    shutil.copytree(REPO / "configs", cwd / "configs")
    # a user's shell: no tracking server or Ray cluster of this machine's other work
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return Tour(cwd, env, cache_dir)


# lines that need the Hugging Face Hub stay out (the tests run offline);
# tests/unit/tasks/test_prepare.py runs `privzo data prepare` on a local copy
RUNNABLE = [command for command, comment in readme_commands() if NEEDS_HUB not in comment]


def _tour_id(command: str) -> str:
    """``07-run-tiny-dpsgd``: the line's place, its command and its config's (or path's) stem."""
    words = [word for word in shlex.split(command)[1:] if not word.startswith("-")][:2]
    names = [Path(word.split(":///")[-1]).stem for word in words]
    return f"{RUNNABLE.index(command):02d}-{'-'.join(names)}"


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.parametrize("command", RUNNABLE, ids=_tour_id)
def test_readme_command_works_as_written(tour, command):
    """One line of the tour, in the tour's order (a later line reads what an earlier wrote), so
    each command's cost shows in the suite's slowest tests."""
    words = _words(command, tour.cwd, tour.cache_dir)
    logs = tour.cwd.parent / f"logs-{RUNNABLE.index(command):02d}"
    # a margin for a loaded machine, not a timing
    done = run_cli(words[1:], tour.cwd, tour.env, logs, timeout=1800)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    check = _matching(CHECKS, command)
    assert callable(check)
    check(words, tour.cwd, done.stdout)
