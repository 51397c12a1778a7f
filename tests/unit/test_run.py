"""End-to-end runs on a tiny model with real MLflow (sqlite in a temp dir), replay, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from privzo.cli import main
from privzo.config import ConfigError, load_config
from privzo.planner import planned_step_bytes, resolve_arch
from privzo.privacy import PoissonSampler, compute_epsilon
from privzo.privacy.plan import make_sampler
from privzo.replay import replay
from privzo.run import RESOURCE_FIGURES, plan_privacy, run
from privzo.rundir import read_run_trajectory
from privzo.tracking import open_client, read_run


def test_private_run_records_summary_trajectory_and_mlflow(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("save_model=true")
    output = tmp_path / "runs" / "dp"
    summary = run(config, output, cache_dir=cache_dir, progress=False)

    on_disk = json.loads((output / "summary.json").read_text())
    assert on_disk == summary.to_dict()
    assert summary.steps == 12 and summary.private is True
    assert 0 < summary.epsilon <= 3.0 * (1 + 1e-6)
    privacy = json.loads((output / "privacy.json").read_text())
    # batches of a public shape: truncating Poisson draws above the bound takes part of δ,
    # and ε is spent at the rest, so the stated δ covers both
    assert summary.pad_to == "max_length" and summary.max_batch_size == privacy["max_batch_size"]
    assert summary.delta == privacy["delta"] == 1e-5
    assert 0 < summary.truncation_delta == privacy["truncation_delta"] <= 1e-7
    assert privacy["mechanism_delta"] == pytest.approx(1e-5 - summary.truncation_delta)
    expected = compute_epsilon(
        noise_multiplier=summary.noise_multiplier,
        sample_rate=8 / 64,
        steps=12,
        delta=privacy["mechanism_delta"],
        noise_parameters=summary.mechanism_parameters,
    )
    assert summary.mechanism_parameters == {"grid": 1024}  # discrete noise by default
    assert summary.epsilon == pytest.approx(expected, rel=1e-9)
    # the records state N = 64, which add/remove neighbours differ in: replace-one covers it
    assert summary.adjacency == "add-remove" and summary.train_examples == 64
    assert summary.replace_one_epsilon == pytest.approx(2 * summary.epsilon)
    assert summary.replace_one_delta == pytest.approx((1 + math.exp(summary.epsilon)) * 1e-5)
    assert summary.skipped_rows is None  # a count over the private file's rows: withheld
    assert privacy["adjacency"] == "add-remove"
    assert privacy["replace_one_epsilon"] == summary.replace_one_epsilon
    assert privacy["replace_one_delta"] == summary.replace_one_delta
    for figure in RESOURCE_FIGURES:  # they follow the sampled records: withheld
        assert getattr(summary, figure) is None, figure
    scores = summary.scores
    assert 0.0 <= scores["accuracy_before"] <= 1.0 and 0.0 <= scores["accuracy_after"] <= 1.0
    assert load_config(output / "config.yaml") == config

    trajectory = pq.read_table(output / "trajectory.parquet")
    assert trajectory.column("step").to_pylist() == list(range(12))
    assert trajectory.column("batch_size").null_count == 12  # withheld in private runs
    assert len(set(trajectory.column("seed").to_pylist())) == 12

    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary.tracking_run_id)
    assert record["status"] == "FINISHED"
    # the run's name says, in full and algorithm first, what tells it apart; its tags filter
    task, seed = config.task.name, config.seed
    assert record["run_name"] == f"dpzero ε=3 tiny-opt seed={seed} {task}"
    for key, value in {"algorithm": "dpzero", "epsilon": "3", "model": "tiny-opt"}.items():
        assert record["tags"][f"privzo.{key}"] == value, key
    assert record["tags"]["privzo.seed"] == str(seed)
    # where a peak is taken, and the planner's step figure the report shows in its place: a
    # forward of the padded batch's rows
    assert record["tags"]["privzo.device"] == "cpu"
    _, arch = resolve_arch(str(output / "model"))
    planned = planned_step_bytes(config, arch, summary.max_batch_size) / 2**20
    assert float(record["tags"]["privzo.planned_step_mb"]) == pytest.approx(planned, abs=1e-3)
    assert record["params"]["optimizer.algorithm"] == "dpzero"
    assert float(record["params"]["privacy.epsilon"]) == 3.0
    assert record["metrics"]["final_epsilon"] == pytest.approx(summary.epsilon)
    assert record["metrics"]["final_replace_one_epsilon"] == pytest.approx(2 * summary.epsilon)
    assert record["metrics"]["final_accuracy_after"] == pytest.approx(scores["accuracy_after"])
    # one value at step 0, which MLflow's chart view draws as a bar per run
    assert [step for step, _ in record["history"]["final_accuracy_after"]] == [0]
    steps = [step for step, _ in record["history"]["epsilon_spent"]]
    assert steps == [5, 10, 12]
    epsilons = [value for _, value in record["history"]["epsilon_spent"]]
    assert epsilons == sorted(epsilons) and epsilons[-1] == pytest.approx(summary.epsilon)
    for private_diagnostic in ("train_loss", "step_time_s", "nonfinite_differences"):
        assert private_diagnostic not in record["history"]  # data-dependent: not logged
    for figure in RESOURCE_FIGURES:
        assert f"final_{figure}" not in record["metrics"], figure
    client = open_client(uri)  # no timing either: metrics are stamped start + step
    start = client.get_run(summary.tracking_run_id).info.start_time
    stamps = client.get_metric_history(summary.tracking_run_id, "epsilon_spent")
    assert sorted((m.step, m.timestamp) for m in stamps) == [(s, start + s) for s in (5, 10, 12)]
    assert record["end_time"] == start
    assert summary.nonfinite_differences is None and summary.empty_batches is None
    run_files = {"summary.json", "trajectory.parquet", "config.yaml", "privacy.json"}
    assert run_files <= set(record["artifacts"])
    # the trajectory's key stays in the directory; the file there passes its keyed checksum
    assert "trajectory.key" not in record["artifacts"] and (output / "trajectory.key").is_file()
    assert read_run_trajectory(output / "trajectory.parquet")[0].num_rows == 12
    assert "tracking.uri" not in record["params"]
    released = [
        *record["params"].values(),
        *(p.read_bytes().decode("latin-1") for p in output.iterdir() if p.is_file()),
    ]
    assert not any("film" in text for text in released)  # no raw training text anywhere


def test_replay_rebuilds_the_trained_weights_bit_for_bit(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("save_model=true", "tracking.backend=none")
    output = tmp_path / "dp"
    run(config, output, cache_dir=cache_dir, progress=False)
    trained = load_file(output / "model" / "model.safetensors")
    loaded, _model, steps = replay("tiny-opt", output / "trajectory.parquet", cache_dir=cache_dir)
    assert steps == 12
    replayed = loaded.model.state_dict()
    for name, tensor in trained.items():
        assert torch.equal(replayed[name], tensor), name
    base = replay_base(cache_dir)
    changed = sum(not torch.equal(base[name], tensor) for name, tensor in trained.items())
    assert changed == len(trained)  # full fine-tuning moved every tensor


def replay_base(cache_dir: Path) -> dict[str, torch.Tensor]:
    from privzo.config import ModelConfig
    from privzo.models.loading import load_model

    return load_model(ModelConfig(name_or_path="tiny-opt"), cache_dir).model.state_dict()


def _replay_with_cli(tmp_path: Path, cache_dir: Path) -> None:
    """`privzo replay` of tmp_path/run's trajectory onto tiny-opt, into tmp_path/rebuilt."""
    trajectory = tmp_path / "run" / "trajectory.parquet"
    args = ["replay", "--base", "tiny-opt", "--trajectory", str(trajectory)]
    assert (
        main([*args, "--output-dir", str(tmp_path / "rebuilt"), "--cache-dir", str(cache_dir)]) == 0
    )


def test_replay_command_saves_hf_weights(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("save_model=true", "tracking.backend=none")
    run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    _replay_with_cli(tmp_path, cache_dir)
    rebuilt = load_file(tmp_path / "rebuilt" / "model.safetensors")
    trained = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert rebuilt.keys() == trained.keys()
    assert all(torch.equal(rebuilt[name], trained[name]) for name in trained)


def test_replay_rebuilds_a_half_precision_runs_intended_fp32_model(
    tmp_path, tiny_run_config, cache_dir, capsys
):
    config = tiny_run_config("save_model=true", "tracking.backend=none", "model.dtype=bfloat16")
    run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    trajectory = tmp_path / "run" / "trajectory.parquet"
    base = ["replay", "--base", "tiny-opt", "--trajectory", str(trajectory)]
    fp32 = [*base, "--output-dir", str(tmp_path / "fp32"), "--cache-dir", str(cache_dir)]
    assert main([*fp32, "--dtype", "float32"]) == 0
    intended = load_file(tmp_path / "fp32" / "model.safetensors")
    trained = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert {tensor.dtype for tensor in intended.values()} == {torch.float32}
    assert any(not torch.equal(intended[name].bfloat16(), trained[name]) for name in trained)
    for name, tensor in trained.items():  # the run's roundings, a bf16 ulp or so per weight
        torch.testing.assert_close(intended[name], tensor.float(), rtol=0.05, atol=0.01)
    rounded = [*base, "--output-dir", str(tmp_path / "bad"), "--cache-dir", str(cache_dir)]
    assert main([*rounded, "--device", "cuda:0"]) == 2  # this machine has no CUDA
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_replay_refuses_another_base_model(tmp_path, tiny_run_config, cache_dir, capsys):
    config = tiny_run_config("tracking.backend=none", "optimizer.steps=2")
    run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    trajectory = str(tmp_path / "run" / "trajectory.parquet")
    args = ["replay", "--trajectory", trajectory, "--cache-dir", str(cache_dir)]
    assert main([*args, "--base", "tiny-roberta", "--output-dir", str(tmp_path / "x")]) == 2
    assert "is not the model this trajectory was trained from" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_replay_refuses_what_the_trajectory_cannot_reproduce(tmp_path):
    from privzo.config import ModelConfig
    from privzo.replay import check_replay_target
    from privzo.zo.trajectory import TrajectoryMeta

    cuda_blocks = TrajectoryMeta(1e-3, "gaussian", "cuda", "full", {}, 0, "m", "float32", "inplace")
    target = ModelConfig(name_or_path="tiny-opt", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="--device cuda"):
        check_replay_target(cuda_blocks, target)
    fp32 = TrajectoryMeta(1e-3, "gaussian", "cpu", "full", {}, 0, "m", "float32", "inplace")
    with pytest.raises(ValueError, match="--dtype float32"):
        check_replay_target(fp32, target.model_copy(update={"dtype": "bfloat16"}))
    philox = TrajectoryMeta(
        1e-3, "gaussian", "cuda", "full", {}, 0, "m", "float32", "inplace", "philox"
    )
    check_replay_target(philox, target)  # counter-based: any device


def test_nonprivate_run_logs_train_loss_and_no_epsilon(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("optimizer.algorithm=mezo", "privacy.sampler=shuffle")
    summary = run(config, tmp_path / "runs" / "mezo", cache_dir=cache_dir, progress=False)
    assert summary.private is False and summary.epsilon is None
    assert summary.adjacency is None and summary.replace_one_epsilon is None
    assert summary.skipped_rows == 0  # nothing private: the count is kept
    trajectory = pq.read_table(tmp_path / "runs" / "mezo" / "trajectory.parquet")
    assert trajectory.column("batch_size").to_pylist() == [8] * 12
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary.tracking_run_id)
    assert [step for step, _ in record["history"]["train_loss"]] == [5, 10, 12]


def test_masked_lm_run(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(
        "model.name_or_path=tiny-roberta",
        "tracking.backend=none",
        "task.template={sentence} It was {mask} .",
    )
    summary = run(config, tmp_path / "mlm", cache_dir=cache_dir, progress=False)
    assert summary.steps == 12


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.name_or_path=/nonexistent/model-dir", "/nonexistent/model-dir"),
        ("task.train_path=/nonexistent/train.jsonl", "/nonexistent/train.jsonl"),
        ("optimizer.batch_size=1000", "optimizer.batch_size=1000"),
        ("task.label_words=[great, Great]", "map to equal tokens"),  # the tokenizer lowercases
        ("privacy.noise_multiplier=0.2", "privacy.noise_multiplier=0.2"),
        ("task.max_length=5000", "task.max_length=5000"),
        ("task.label_field=stars", "task.label_field"),
        ("task.text_field=review", "task.text_field"),
        ("tracking.uri=notascheme://nowhere", "tracking.uri"),
        ("privacy.noise_multiplier=0.01", "noise_multiplier=0.01 is below"),
        ("privacy.epsilon=1e-6", "settings cannot be met"),
    ],
)
def test_bad_input_fails_before_compute_and_keeps_records(
    tmp_path, tiny_run_config, cache_dir, override, message
):
    output = tmp_path / "runs" / "bad"
    output.mkdir(parents=True)
    (output / "notes.txt").write_text("kept")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        run(tiny_run_config(override), output, cache_dir=cache_dir, progress=False)
    assert (output / "notes.txt").read_text() == "kept"
    assert not (output / "trajectory.parquet").exists()
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing recorded
    assert sorted(p.name for p in output.iterdir()) == ["notes.txt"]


def test_unreachable_hub_id_is_a_config_error(tmp_path, tiny_run_config, cache_dir):
    """Offline, the hub is asked once (transformers would retry for about 20 s) and the error
    names the field and why."""
    config = tiny_run_config("model.name_or_path=nonexistent-org/nonexistent-model")
    with pytest.raises(ConfigError, match=r"model\.name_or_path=.*Hub cannot be reached"):
        run(config, tmp_path / "o", cache_dir=cache_dir, progress=False)


def test_a_finished_run_is_not_overwritten(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("tracking.backend=none", "optimizer.steps=2")
    run(config, tmp_path / "r", cache_dir=cache_dir, progress=False)
    before = (tmp_path / "r" / "summary.json").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        run(config, tmp_path / "r", cache_dir=cache_dir, progress=False)
    assert (tmp_path / "r" / "summary.json").read_text() == before
    bad = tiny_run_config("tracking.backend=none", "task.max_length=5000")
    with pytest.raises(ConfigError, match="max_length"):  # a bad --overwrite run erases nothing
        run(bad, tmp_path / "r", cache_dir=cache_dir, progress=False, overwrite=True)
    assert (tmp_path / "r" / "summary.json").read_text() == before
    (tmp_path / "r" / "summary.json").unlink()  # an interrupted run: trajectory, no summary
    with pytest.raises(ConfigError, match=r"trajectory\.parquet"):
        run(config, tmp_path / "r", cache_dir=cache_dir, progress=False)
    run(config, tmp_path / "r", cache_dir=cache_dir, progress=False, overwrite=True)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 2


def test_cli_run_prints_summary_and_rejects_bad_config(
    tmp_path, sentiment_files, cache_dir, capsys
):
    train, test = sentiment_files
    config_path = tmp_path / "run.yaml"
    config_path.write_text(
        f"model: {{name_or_path: tiny-opt}}\ntask: {{train_path: {train}, test_path: {test}}}\n"
        "optimizer: {steps: 3, batch_size: 8}\ntracking: {backend: none}\n"
    )
    args = [
        "run",
        str(config_path),
        "privacy.epsilon=5",
        "--output-dir",
        str(tmp_path / "out"),
        "--cache-dir",
        str(cache_dir),
        "--quiet",
        "optimizer.steps=2",  # overrides may also follow the options
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "accuracy_after" in printed and "epsilon" in printed
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["steps"] == 2
    bad = ["run", str(config_path), "privacy.delta=2", "--output-dir", str(tmp_path / "o2")]
    assert main(bad) == 2
    assert "privacy.delta" in capsys.readouterr().err


def test_private_runs_sample_poisson_batches_from_a_secret_generator(tiny_run_config):
    """Two private runs with identical configs (and seeds) draw different Poisson batches."""
    config = tiny_run_config()
    plan = plan_privacy(config, dataset_size=64)
    samplers = [make_sampler(config, plan, 64) for _ in range(2)]
    assert all(isinstance(sampler, PoissonSampler) for sampler in samplers)
    draws = [[tuple(s.next_batch()) for _ in range(20)] for s in samplers]
    assert draws[0] != draws[1]
    sizes = {len(batch) for batch in draws[0]}
    assert len(sizes) > 1  # variable batch sizes, as the accountant assumes


def test_private_diagnostics_are_logged_only_when_asked(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config("tracking.log_private_diagnostics=true")
    summary = run(config, tmp_path / "runs" / "d", cache_dir=cache_dir, progress=False)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    history = read_run(uri, summary.tracking_run_id)["history"]
    assert {"train_loss", "step_time_s", "nonfinite_differences"} <= set(history)
    assert summary.nonfinite_differences == 0 and summary.empty_batches >= 0
    assert all(getattr(summary, figure) > 0 for figure in RESOURCE_FIGURES)
    assert {f"final_{figure}" for figure in RESOURCE_FIGURES} <= set(history)


def test_two_runs_with_the_same_seeds_draw_different_noise(tmp_path, tiny_run_config, cache_dir):
    """Directions are public and repeat; the noise is secret and does not."""
    config = tiny_run_config("tracking.backend=none", "optimizer.steps=4")
    tables = []
    for name in ("first", "second"):
        run(config, tmp_path / name, cache_dir=cache_dir, progress=False, tracking_root=tmp_path)
        tables.append(pq.read_table(tmp_path / name / "trajectory.parquet"))
    first, second = tables
    assert first.column("seed").to_pylist() == second.column("seed").to_pylist()
    gradients = zip(
        first.column("projected_gradient").to_pylist(),
        second.column("projected_gradient").to_pylist(),
        strict=True,
    )
    assert all(a != b for a, b in gradients)


@pytest.mark.parametrize("view", ["bitfit", "lora", "prefix"])
def test_peft_runs_replay_bit_for_bit(tmp_path, tiny_run_config, cache_dir, view):
    """A run with a PEFT view saves its trained tensors; replay rebuilds exactly those."""
    config = tiny_run_config(
        f"model.trainable={view}",
        "model.peft.lora_rank=2",
        "save_model=true",
        "tracking.backend=none",
        "optimizer.steps=6",
    )
    summary = run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    _replay_with_cli(tmp_path, cache_dir)
    weights = "model.safetensors" if view == "bitfit" else "adapter_model.safetensors"
    trained = load_file(tmp_path / "run" / "model" / weights)
    rebuilt = load_file(tmp_path / "rebuilt" / weights)
    assert trained.keys() == rebuilt.keys() and trained
    assert all(torch.equal(rebuilt[name], trained[name]) for name in trained)
    full = replay_base(cache_dir)
    assert summary.trainable_parameters < sum(t.numel() for t in full.values())


def _with_perturbation_scale(config, scale: float):
    """``config`` with a perturbation scale outside the validated range (``model_copy`` does not
    validate), to test what a run does when its steps overflow anyway."""
    optimizer = config.optimizer.model_copy(update={"perturbation_scale": scale})
    return config.model_copy(update={"optimizer": optimizer})


@pytest.mark.parametrize("diagnostics", [False, True])
def test_nonfinite_count_reaches_the_console_only_with_diagnostics(
    tmp_path, tiny_run_config, cache_dir, caplog, diagnostics
):
    """A perturbation of 1e30 overflows every loss (the weights stay finite); the count of
    non-finite differences is data-dependent, so a private run prints it only when diagnostics
    are on. A config refuses such a scale, so it is set past validation to reach the run's
    own guard."""
    config = _with_perturbation_scale(
        tiny_run_config(
            "optimizer.steps=2",
            "tracking.backend=none",
            "eval_before=false",
            f"tracking.log_private_diagnostics={str(diagnostics).lower()}",
        ),
        1e30,
    )
    with caplog.at_level("WARNING", logger="privzo.run"):
        summary = run(config, tmp_path / "o", cache_dir=cache_dir, progress=False)
    printed = "non-finite" in caplog.text
    assert printed == diagnostics
    if diagnostics:
        assert summary.nonfinite_differences > 0


def test_a_step_that_destroys_the_weights_stops_the_run(tmp_path, tiny_run_config, cache_dir):
    """θ ± 1e38·z overflows fp32: the run stops at the window's check with the trajectory it
    made, instead of finishing with NaN weights (the scale is set past the config's range
    check, which refuses it)."""
    from privzo.zo.integrity import NonFiniteWeightsError

    config = _with_perturbation_scale(
        tiny_run_config("optimizer.steps=12", "tracking.backend=none", "eval_before=false"),
        1e38,
    )
    with pytest.raises(NonFiniteWeightsError, match="after step 5 the weights"):
        run(config, tmp_path / "o", cache_dir=cache_dir, progress=False)
    trajectory = pq.read_table(tmp_path / "o" / "trajectory.parquet")
    assert trajectory.num_rows == 5  # the first window (log_every=5), kept
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_forward_on_an_empty_batch_reads_no_training_record(tiny_run_config, cache_dir):
    """ZeRO-3 ranks join both forwards even when their Poisson share is empty; the input is the
    task's public example, never a private record (here: records wiped, a step still runs)."""
    from privzo.algorithms.stepper import StepMeter
    from privzo.algorithms.zeroth_order import ZerothOrderStepper
    from privzo.memory import PeakMemory
    from privzo.run import build_context

    config = tiny_run_config("tracking.backend=none")
    context = build_context(config, cache_dir, progress=False)
    context.train.input_ids.clear()  # nothing private left to read
    sampler = PoissonSampler(64, 1e-12)  # an empty batch (probability 1 - 6.4e-11)
    stepper = ZerothOrderStepper(
        context, StepMeter(PeakMemory()), sampler=sampler, forward_on_empty=True
    )
    outcome = stepper.step(0)
    assert outcome.empty and outcome.record is not None and outcome.record.nonfinite == 0
    example = context.task.public_example()
    assert len(example) == 1 and "film" not in context.loaded.tokenizer.decode(example.input_ids[0])
