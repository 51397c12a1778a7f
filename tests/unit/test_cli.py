"""The ``privzo privacy`` and ``privzo bench`` commands, run through the real CLI entry point."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from privzo.cli import main
from privzo.rundir.summary import summary_lines

KEYS = {
    "noise_multiplier",
    "epsilon",
    "delta",
    "sample_rate",
    "steps",
    "mechanism",
    "accountant",
    "noise_grid",
    "directions",
}


def _json(capsys, args: list[str]) -> dict:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_calibrate_json_round_trips_through_epsilon(capsys):
    calibrated = _json(
        capsys,
        [
            "privacy",
            "calibrate",
            "--epsilon",
            "2",
            "--delta",
            "1e-5",
            "--batch-size",
            "32",
            "--dataset-size",
            "1000",
            "--steps",
            "300",
            "--json",
        ],
    )
    assert set(calibrated) == KEYS
    assert calibrated["sample_rate"] == pytest.approx(0.032)
    assert calibrated["mechanism"] == "gaussian" and calibrated["accountant"] == "pld"
    assert calibrated["epsilon"] <= 2.0 and calibrated["epsilon"] == pytest.approx(2.0, rel=0.01)
    again = _json(
        capsys,
        [
            "privacy",
            "epsilon",
            "--noise-multiplier",
            str(calibrated["noise_multiplier"]),
            "--delta",
            "1e-5",
            "--sample-rate",
            "0.032",
            "--steps",
            "300",
            "--json",
        ],
    )
    assert again["epsilon"] == pytest.approx(calibrated["epsilon"], rel=1e-9)


def test_epsilon_for_laplace_pure_matches_the_closed_form(capsys):
    result = _json(
        capsys,
        [
            "privacy",
            "epsilon",
            "--noise-multiplier",
            "4",
            "--delta",
            "0",
            "--sample-rate",
            "1",
            "--steps",
            "10",
            "--mechanism",
            "laplace",
            "--accountant",
            "pure",
            "--json",
        ],
    )
    assert result["epsilon"] == pytest.approx(10 / 4)  # pure composition: T / σ at p = 1


def test_human_readable_output(capsys):
    assert (
        main(
            [
                "privacy",
                "calibrate",
                "--epsilon",
                "4",
                "--delta",
                "1e-5",
                "--sample-rate",
                "0.01",
                "--steps",
                "100",
                "--accountant",
                "rdp",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "noise multiplier" in printed and "rdp" in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sample-rate", "0.1", "--batch-size", "3", "--dataset-size", "30"], "not both"),
        (["--batch-size", "3"], "--dataset-size"),
        (["--batch-size", "50", "--dataset-size", "30"], "batch size"),
        (["--sample-rate", "1.5"], "--sample-rate 1.5 is out of range; allowed: (0, 1]"),
        (["--sample-rate", "0.1", "--delta", "0"], "--delta 0.0 is out of range"),
        (["--sample-rate", "0.1", "--noise-grid", "0"], "--noise-grid 0 must be an integer ≥ 16"),
        (["--sample-rate", "0.1", "--mechanism", "laplace", "--accountant", "rdp"], "laplace"),
        (["--sample-rate", "0.1", "--steps", "1000000000"], "steps ≤ 10_000_000"),
        (["--sample-rate", "0.1", "--steps", "0"], "allowed: 1 ≤ steps"),
    ],
)
def test_bad_privacy_arguments_exit_2_with_a_message(capsys, args, message):
    base = ["privacy", "epsilon", "--noise-multiplier", "1", "--delta", "1e-5", "--steps", "10"]
    assert main(base + args) == 2
    assert message in capsys.readouterr().err


def test_the_accountants_refusal_names_the_option_written(capsys):
    args = ["privacy", "epsilon", "--noise-multiplier", "0", "--delta", "1e-5", "--steps", "10"]
    assert main([*args, "--sample-rate", "0.1"]) == 2
    assert "privzo: error: --noise-multiplier 0.0 is out of range" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "privzo: error: --gpus must be >= 1, got 0"),
        (["--gpus", "1", "--batch-size", "0"], "privzo: error: --batch-size must be >= 1"),
        (["--gpus", "1", "--gpu-memory-gb", "nan"], "--gpu-memory-gb must be a finite number"),
        (["--gpus", "1", "--gpu-memory-gb", "1e30"], "--gpu-memory-gb must be a finite number "),
        (
            ["--gpus", "1", "--offload", "cpu", "--host-memory-gb", "1e30"],
            "privzo: error: --host-memory-gb must be a finite number > 0 and ≤ 1000000 (GiB; no "
            "machine has more), got 1e+30",
        ),
    ],
)
def test_the_planners_refusal_names_the_option_written(capsys, args, message):
    assert main(["plan", "--model", "opt-125m", "--gpu-memory-gb", "80", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_audits_refusal_names_the_options_written(capsys, tmp_path):
    args = ["audit", "configs/runs/tiny-mezo.yaml", "--output-dir", str(tmp_path / "a")]
    assert main([*args, "--canaries", "0", "--k", "0"]) == 2
    err = capsys.readouterr().err
    assert "\n  --canaries: Input should be greater than or equal to 2 (got 0)" in err
    assert "\n  --k: " in err and "\n  canaries:" not in err and "\n  ks:" not in err
    assert not (tmp_path / "a").exists()


def test_words_that_are_not_overrides_are_named_alone(capsys, tmp_path):
    args = ["run", "configs/runs/tiny-dpzero.yaml", "--output-dir", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as stopped:
        main([*args, "optimizer.steps=2", "optimizer.batch_size"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: optimizer.batch_size; an override is written" in err
    assert "optimizer.steps=2" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("option", ["--output-dir", "--cache-dir"])
def test_a_directory_option_naming_a_file_is_refused(capsys, tmp_path, option):
    (tmp_path / "file").write_text("x")
    args = {"--output-dir": str(tmp_path / "r"), "--cache-dir": str(tmp_path / "c")}
    args[option] = str(tmp_path / "file")
    argv = ["run", "configs/runs/tiny-dpzero.yaml", *(x for pair in args.items() for x in pair)]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"argument {option}: '{tmp_path / 'file'}' is a file, not a directory" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "args",
    [
        ["run", "configs/runs/tiny-dpzero.yaml", "--output-dir", ""],
        ["models", "init", "--shape", "tiny", "--output-dir", " "],
        ["tune", "configs/searches/tiny.yaml", "--output-dir", ""],
        ["run", ""],
    ],
)
def test_an_empty_path_is_refused_before_the_command_runs(capsys, args):
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert "an empty path names no file or directory" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_zo_step_prints_measured_ratios(capsys):
    # medians of 5 rounds (the command's default): on a shared machine one round's forward can
    # read far slower than the others, which the sanity check below is not about
    result = _json(capsys, ["bench", "zo-step", "--json", "--repeats", "5"])
    assert result["model"]["parameters"] >= 5_000_000
    for name in ("forward", "mezo", "dpzero", "mezo_reference", "one_sweep", "read_write"):
        assert result["seconds"][name] > 0 and result["peak_memory_mb"][name] > 0
    seconds = result["seconds"]
    assert result["ratios"]["dpzero_step_over_two_forwards"] == pytest.approx(
        seconds["dpzero"] / (2 * seconds["forward"])
    )
    # a step does two forwards and three sweeps, so it cannot be faster than two forwards
    assert seconds["dpzero"] > 1.5 * seconds["forward"]
    assert "ABOVE TARGET" in result["table"] or " ok" in result["table"]


def test_plan_command_json_and_table(capsys):
    result = _json(
        capsys,
        [
            "plan",
            "--model",
            "opt-66b",
            "--gpus",
            "8",
            "--gpu-memory-gb",
            "80",
            "--dtype",
            "fp16",
            "--json",
        ],
    )
    assert {"model", "parameters", "strategy", "gpus", "bytes_per_gpu", "fits"} <= set(result)
    assert result["strategy"] == "zero3" and result["fits"] is True and result["gpus"] == 8
    assert main(["plan", "--model", "all", "--gpus", "1", "--gpu-memory-gb", "24"]) == 0
    table = capsys.readouterr().out
    assert "opt-125m" in table and "opt-66b" in table and "NO" in table
    assert main(["plan", "--model", "opt-7b", "--gpus", "1", "--gpu-memory-gb", "24"]) == 2
    assert "opt-7b" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys):
    from privzo import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"privzo {__version__}"


def test_help_speaks_to_users_not_developers(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "parse, build, call, print" not in text
    assert "without backpropagation" in text and "--version" in text


def test_run_help_documents_config_output_dir_and_overrides(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "a run config (YAML)" in text
    assert "the run's directory" in text  # --output-dir has a help line
    assert "optimizer.steps=800 privacy.epsilon=4 --output-dir runs/x" in text  # an example
    assert "--verbose" in text and "--json" in text


def test_run_json_prints_the_summary_as_one_parsable_line(tmp_path, capsys, sentiment_files):
    """What jobs/run.py (a `ray job submit` entry point) prints, through the same CLI."""
    train, test = sentiment_files
    output = tmp_path / "run"
    arguments = ["run", str(REPO / "configs/runs/tiny-mezo.yaml"), "model.name_or_path=tiny-opt"]
    arguments += [f"task.train_path={train}", f"task.test_path={test}", "task.builtin_dataset=null"]
    arguments += ["optimizer.steps=4", "optimizer.batch_size=4", "tracking.backend=none"]
    arguments += ["--output-dir", str(output), "--quiet", "--json"]
    arguments += ["--cache-dir", str(tmp_path / "cache")]
    assert main(arguments) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)["privzo_summary"]
    assert summary == json.loads((output / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["algorithm"] == "mezo"


# What a config error must not wait for: each takes seconds to import (scipy and dp_accounting
# come with the accountants, which the config asks which noise each one bounds).
HEAVY = ("torch", "transformers", "ray", "mlflow", "scipy", "dp_accounting")


def _loaded_heavy(code: str, *arguments: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; it prints the HEAVY modules it loaded."""
    probe = f"import sys\n{code}\nprint(sorted(set({HEAVY!r}) & set(sys.modules)))"
    return subprocess.run(
        [sys.executable, "-c", probe, *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["configs/runs/tiny-dpzero.yaml", "optimizer.stepz=3"], "optimizer.stepz: unknown key"),
        (["configs/runs/tiny-dpzero.yaml", "privacy.epsilon=-1"], "privacy.epsilon: Input should"),
    ],
)
def test_config_errors_come_before_the_heavy_libraries_are_imported(command, arguments, message):
    """A typo costs a second: the config is read and validated before torch, transformers,
    Ray, MLflow, scipy or dp_accounting load."""
    done = _loaded_heavy(
        "from privzo.cli import main\ncode = main(sys.argv[1:])\nassert code == 2, code",
        command,
        *arguments,
        "--output-dir",
        "unused",
    )
    assert done.returncode == 0, done.stderr
    assert message in done.stderr
    assert done.stdout.strip() == "[]"


def test_a_valid_config_is_loaded_and_validated_without_the_heavy_libraries():
    load = (
        "import argparse\nfrom privzo.cli.arguments import load_run_config\n"
        "args = argparse.Namespace(config='configs/runs/tiny-dpzero.yaml', "
        "overrides=['configs/models/opt-125m.yaml', 'privacy.epsilon=4'])\n"
        "config = load_run_config(args)\nassert config.privacy.epsilon == 4"
    )
    done = _loaded_heavy(load)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_run_summary_shows_the_tasks_own_metrics_and_no_none(tmp_path):
    """A generation task's scores are exact match and F1; a private run without diagnostics
    records no step time: the console shows what was recorded, nothing as None."""
    summary = {
        "model": "tiny-opt",
        "task": "squad",
        "algorithm": "dpzero",
        "metric": "f1",
        "metric_before": 0.125,
        "metric_after": 0.25,
        "exact_match_before": 0.0,
        "exact_match_after": 0.125,
        "f1_before": 0.125,
        "f1_after": 0.25,
        "epsilon": 1.9875,
        "delta": 1e-5,
        "noise_multiplier": 1.5,
        "accountant": "pld",
        "steps": 10,
        "mean_step_time_s": None,
        "peak_memory_mb": None,
        "tracking_run_id": None,
        "validation_f1": 0.5,
    }
    lines = summary_lines(summary, tmp_path)
    shown = {line.split()[0]: line.split()[1] for line in lines[:-1]}
    assert list(shown) == [
        "algorithm",
        "exact_match_before",
        "exact_match_after",
        "f1_before",
        "f1_after",
        "epsilon",
        "delta",
        "noise_multiplier",
        "accountant",
        "steps",
    ]
    assert shown["f1_after"] == "0.25" and shown["epsilon"] == "1.988"
    assert "None" not in "\n".join(lines) and "accuracy" not in "\n".join(lines)
    assert lines[-1] == f"results in {tmp_path}"


def test_run_summary_of_a_classification_run_shows_accuracy(tmp_path):
    summary = {"algorithm": "mezo", "accuracy_before": 0.5, "accuracy_after": 0.75}
    summary |= {"epsilon": None, "steps": 4, "mean_step_time_s": 0.125}
    lines = summary_lines(summary, tmp_path)
    assert [line.split()[0] for line in lines[:-1]] == [
        "algorithm",
        "accuracy_before",
        "accuracy_after",
        "steps",
        "mean_step_time_s",
    ]


@pytest.mark.parametrize("command", ["run", "check", "tune", "study"])
def test_a_relative_output_dir_is_refused_inside_a_ray_job(command, monkeypatch, capsys):
    """Ray runs a job's driver in a temporary copy of the working dir: a relative directory
    would vanish with it. The variable is the one Ray sets for a `ray job submit` driver."""
    from privzo.cli.arguments import RAY_JOB_ENV, check_job_output_dir

    monkeypatch.setenv(RAY_JOB_ENV, "{}")
    code = main([command, "missing.yaml", "--output-dir", "runs/x"])
    assert code == 2
    error = capsys.readouterr().err
    assert "--output-dir 'runs/x' is relative, and this command runs inside a Ray job" in error
    check_job_output_dir(REPO / "runs" / "x")  # an absolute one is kept
    monkeypatch.delenv(RAY_JOB_ENV)
    check_job_output_dir(Path("runs/x"))  # outside a job, relative to the user's directory


def test_the_run_job_defaults_to_an_absolute_directory_it_names(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("run_job", REPO / "jobs" / "run.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    default = job.default_output_dir("configs/runs/tiny-dpzero.yaml")
    assert default.is_absolute() and default == Path.home() / "privzo-runs" / "tiny-dpzero"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert job.main(["--config", "missing.yaml", "--output-dir", "runs/x"]) == 2
    assert "is relative, and this command runs inside a Ray job" in capsys.readouterr().err


def test_the_tiny_shapes_size_against_demo_opt_s_is_stated_as_computed(capsys):
    from privzo.models.architecture import DecoderArch, count_parameters
    from privzo.models.builtin import BUILTIN_MODELS, MAX_POSITIONS, build_tokenizer
    from privzo.models.shapes import TINY

    recipe = BUILTIN_MODELS["demo-opt-s"]
    vocab = len(build_tokenizer())
    demo = DecoderArch(recipe.layers, recipe.hidden, recipe.ffn, recipe.heads, vocab, MAX_POSITIONS)
    stated = f"{count_parameters(TINY) / 1e6:.2f}M parameters: "
    stated += f"{count_parameters(TINY) / count_parameters(demo):.1f} times"
    with pytest.raises(SystemExit):
        main(["models", "init", "--help"])
    assert stated in " ".join(capsys.readouterr().out.split())
    assert stated in (REPO / "platform" / "privzo" / "cli" / "bench.py").read_text()


def test_weights_that_overflowed_end_the_command_in_one_line_saying_what_to_change():
    import torch

    from privzo.cli.entry import refusal_line
    from privzo.zo.integrity import NonFiniteWeightsError, check_finite_weights

    weights = [("layer.weight", torch.tensor([1.0, float("inf")])), ("bias", torch.ones(2))]
    with pytest.raises(NonFiniteWeightsError) as overflowed:
        check_finite_weights(weights, steps=40)
    line = refusal_line(overflowed.value)
    assert line is not None and "\n" not in line
    assert line.startswith("privzo: error: after step 40 the weights of 'layer.weight'")
    assert "lower optimizer.learning_rate" in line and "--overwrite" in line
    assert refusal_line(RuntimeError("a bug")) is None  # keeps its traceback
    assert refusal_line(ValueError("bad input")) == "privzo: error: bad input"


@pytest.mark.parametrize(
    ("steps", "why"),
    [("0", "fewer than one"), ("20000000", "more steps than the accountant can carry")],
)
def test_steps_out_of_range_are_refused_saying_which_way(capsys, steps, why):
    args = ["privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1"]
    assert main([*args, "--steps", steps, "--delta", "1e-5"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"privzo: error: --steps {steps}: {why}; allowed: 1 ≤ steps ≤ 10_000_000 (as "
        "optimizer.steps in a run config)"
    )
