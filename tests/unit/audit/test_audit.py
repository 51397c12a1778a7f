"""`privzo audit` end to end on a tiny model: real runs, the real accountant, MLflow in sqlite.

The canaries are at most the 64 training rows of the ``sentiment_files`` fixture; with M = 40
canaries no audit can prove more than ε ≈ 2 (all 40 guesses right), so a correct private run at
ε = 3 is "consistent" whatever the coins, and the zero-noise run claims a tiny ε.
"""

from __future__ import annotations

import json
import stat

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from conftest import write_sentiment_jsonl
from privzo.audit import AUDIT_FILE, VIOLATED_EXIT_CODE, AuditConfig, pipeline, run_audit
from privzo.audit.draw import DRAW_FILE
from privzo.audit.pipeline import audit_scores
from privzo.audit.scores import (
    WhiteBoxTrace,
    centre_by_label,
    clip_as_trained,
    correlation_scores,
    directional_scores,
    likelihood_scores,
    match_scores,
    unshared_gradients,
)
from privzo.cli import main
from privzo.cli.audit import report_audit
from privzo.config import ConfigError
from privzo.run import TrainingLoop
from privzo.tracking import open_client, read_run
from privzo.tracking.clock import PUBLIC_TIME_MS
from privzo.zo.estimators import PrivateEstimator

AUDIT_RUN = ("tracking.log_every=6", "tracking.experiment=audit-test", "eval_before=false")
K_AUDIT = (*AUDIT_RUN, "tracking.backend=none", "optimizer.directions_per_step=2")


def test_private_audit_writes_its_record_and_an_mlflow_child(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(*AUDIT_RUN)
    audit = AuditConfig(canaries=40)
    record = run_audit(config, audit, tmp_path / "audit", cache_dir=cache_dir, progress=False)

    written = json.loads((tmp_path / "audit" / AUDIT_FILE).read_text())
    assert written == record.to_dict()
    assert record.verdict == "consistent"
    assert record.epsilon_claimed == pytest.approx(3.0, rel=0.01)
    assert 0 <= record.epsilon_lower_bound < 2.5
    assert record.canaries == 40 and record.training_rows == 64
    assert record.white_box is True and record.note is None
    assert list(record.results) == ["white-box-directional"]  # the default, fixed beforehand
    assert record.tests == 2 * len(audit.k_values())  # two bounds from each (score, k)
    assert [row.estimator for row in record.estimators] == [
        "one-run",
        "one-run-f-dp-gaussian",
        "tpr-at-fpr",
    ]
    assert record.estimators[0].epsilon == record.epsilon_lower_bound  # the verdict's bound
    assert record.tightest in {row.estimator for row in record.estimators}
    rate = record.tpr_at_fpr["white-box-directional"]
    assert rate.canaries_in == record.canaries_in and 0 <= rate.tpr_low <= rate.tpr <= 1
    best = record.best
    assert best.guesses == 2 * best.k and 0 <= best.correct <= best.guesses
    distribution = record.score_distributions["white-box-directional"]
    assert distribution["in"]["count"] + distribution["out"]["count"] == 40
    assert (tmp_path / "audit" / "audit_scores.png").stat().st_size > 0
    assert (tmp_path / "audit" / "run" / "trajectory.parquet").is_file()
    # the run trained on its rows plus the canaries that came up "in"; nothing names them
    summary = json.loads((tmp_path / "audit" / "run" / "summary.json").read_text())
    assert summary["train_examples"] == 64 + record.canaries_in
    assert "included" not in json.dumps(record.to_dict())
    assert "audit_time_s" not in record.to_dict()  # a private run's duration is withheld

    uri = f"sqlite:///{(tmp_path / 'audit' / 'mlflow.db').resolve()}"
    child = read_run(uri, record.tracking_run_id)
    assert child["tags"]["mlflow.parentRunId"] == record.audited_run_id
    assert child["tags"]["privzo.audit.verdict"] == "consistent"
    assert child["metrics"]["epsilon_lower_bound"] == pytest.approx(record.epsilon_lower_bound)
    assert child["metrics"]["epsilon_claimed"] == pytest.approx(record.epsilon_claimed)
    fdp = record.estimators[1].epsilon
    assert child["metrics"]["epsilon_one_run_f_dp_gaussian"] == pytest.approx(fdp)
    artifacts = {item.path for item in open_client(uri).list_artifacts(record.tracking_run_id)}
    assert {AUDIT_FILE, "audit_scores.png"} <= artifacts
    parent = read_run(uri, record.audited_run_id)
    assert parent["status"] == "FINISHED" and parent["tags"]["privzo.audit"] == "true"
    # the audit and its private run release no clock: both start and end at the public time
    for logged in (child, parent):
        assert logged["start_time"] == logged["end_time"] == PUBLIC_TIME_MS


PUBLIC_SEED = 0  # the broken run's noise seed: the run's own logged seed


def test_a_run_whose_noise_comes_from_a_public_seed_is_flagged_violated(
    tmp_path, tiny_run_config, cache_dir, monkeypatch, capsys
):
    """The broken run: DPZero's accountant claims ε = 0.5, but its noise comes from a generator
    seeded with a public seed (the bug of a public implementation that seeds the global generator
    with the logged seed), so the auditor regenerates it and takes it out of every g_t.

    Batches of one expected record: a step that sampled a canary alone then releases its clipped
    d_c(θ_t) exactly, which the white-box match score finds (29 of 30 guesses right when this
    was written: ε_lb ≈ 1.4 by the one-run bound, 2.6 by the Gaussian f-DP one)."""
    generator = np.random.default_rng(PUBLIC_SEED)

    def seeded_noise(self: PrivateEstimator) -> float:
        return float(generator.normal(scale=self.noise_multiplier * self.clip))

    def regenerate(steps: int, scale: float) -> np.ndarray:
        return np.random.default_rng(PUBLIC_SEED).normal(scale=scale, size=steps)

    monkeypatch.setattr(PrivateEstimator, "draw_noise", seeded_noise)
    config = tiny_run_config(
        *AUDIT_RUN,
        "optimizer.steps=560",
        "optimizer.batch_size=1",
        "optimizer.learning_rate=1e-5",  # noise of scale σC = 200 must not swamp the model
        "privacy.epsilon=0.5",
        "privacy.clip=100.0",
        # the float sampler: on the default grid (γ = σC/1024, C = 100) the released sum is
        # d_c rounded to γ, and the zero-noise version of this test read "consistent" there
        "privacy.noise_grid=null",
    )
    audit = AuditConfig(canaries=60, ks=[15], scores=["white-box-match", "black-box"])
    record = run_audit(
        config, audit, tmp_path / "a", cache_dir=cache_dir, progress=False, public_noise=regenerate
    )
    assert record.verdict == "VIOLATED", record.best
    assert record.violated and record.epsilon_lower_bound > record.epsilon_claimed
    assert record.best.score == "white-box-match"
    assert list(record.results) == ["white-box-match", "black-box"]
    assert record.tests == 4  # two scores, one k, two bounds
    # what `privzo audit` does with it: the verdict on stderr and its own exit code
    assert report_audit(record, as_json=False) == VIOLATED_EXIT_CODE == 4
    assert "PRIVACY VIOLATED" in capsys.readouterr().err


def test_a_non_private_k_direction_run_reports_its_leakage_white_box(
    tmp_path, tiny_run_config, cache_dir
):
    """MeZO with two directions a step and batches of one over 16 rows and 16 canaries, every
    row sampled once: a step that sampled an in-canary released its K-vector of differences
    exactly, which the match score (chosen before the run) finds; no out-canary's is released."""
    train = write_sentiment_jsonl(tmp_path / "train16.jsonl", 16, seed=1)
    config = tiny_run_config(
        *K_AUDIT,
        f"task.train_path={train}",
        "optimizer.algorithm=mezo",
        "privacy.sampler=shuffle",
        "optimizer.batch_size=1",
        "optimizer.steps=32",  # one epoch of the 16 rows and at most 16 in-canaries
    )
    audit = AuditConfig(canaries=16, ks=[1], scores=["white-box-match"])
    record = run_audit(config, audit, tmp_path / "a", cache_dir=cache_dir, progress=False)
    assert record.verdict == "not private"
    assert record.epsilon_claimed is None and record.tightness is None
    assert record.epsilon_lower_bound >= 0
    assert record.audit_time_s > 0  # a non-private run's time is released
    assert record.white_box is True and record.note is None
    distribution = record.score_distributions["white-box-match"]
    assert distribution["in"]["q05"] > distribution["out"]["q95"] + 5  # exact against near
    assert record.results["white-box-match"][0].correct == 2  # the 'in' and the 'out' guess


def test_a_first_order_run_is_audited_black_box_only(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(*AUDIT_RUN, "optimizer.algorithm=adamw", "optimizer.steps=4")
    record = run_audit(
        config,
        AuditConfig(canaries=20, ks=[5]),
        tmp_path / "a",
        cache_dir=cache_dir,
        progress=False,
    )
    assert list(record.results) == ["black-box"]
    assert record.white_box is False and "black-box only" in record.note
    with pytest.raises(ConfigError, match="writes no trajectory"):
        run_audit(
            config,
            AuditConfig(canaries=20, scores=["white-box-likelihood"]),
            tmp_path / "b",
            cache_dir=cache_dir,
        )


def _interrupt(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, when) -> None:
    """Ctrl+C (what it raises) from ``owner.name`` the first time ``when(args)`` holds."""
    real = getattr(owner, name)

    def stop(*args, **kwargs):
        if when(args):
            monkeypatch.undo()
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stop)


def test_a_stopped_audit_goes_on_with_its_secret_draw(
    tmp_path, tiny_run_config, cache_dir, monkeypatch
):
    """Stopped mid-run, the same call goes on from the run's trajectory into its MLflow run with
    the same canaries and coins (kept 0600 in the audit's directory, not in MLflow); stopped
    after the run finished, it is scored from that run, nothing trained again; --overwrite
    draws anew and drops the earlier audit's record."""
    config = tiny_run_config(*AUDIT_RUN)
    audit = AuditConfig(canaries=20, ks=[5], scores=["black-box"])
    output = tmp_path / "audit"
    call = {"cache_dir": cache_dir, "progress": False}
    _interrupt(monkeypatch, TrainingLoop, "step", lambda args: args[1] == 7)
    with pytest.raises(KeyboardInterrupt):
        run_audit(config, audit, output, **call)
    secret = output / DRAW_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    drawn = json.loads(secret.read_text())
    kept = pq.read_table(output / "run" / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in kept] == list(range(7))  # the steps taken before Ctrl+C
    killed = json.loads((output / "run" / "resume.json").read_text())["tracking_run_id"]

    secret.rename(tmp_path / "aside")
    with pytest.raises(ConfigError, match=r"canaries\.secret\.json.*is missing.*7 released steps"):
        run_audit(config, audit, output, **call)
    (tmp_path / "aside").rename(secret)
    with pytest.raises(ConfigError, match="drawn for another run config or audit settings"):
        run_audit(config, AuditConfig(canaries=20, ks=[4], scores=["black-box"]), output, **call)

    _interrupt(monkeypatch, pipeline, "guess_and_bound", lambda _args: True)
    with pytest.raises(KeyboardInterrupt):  # after the run finished, before audit.json
        run_audit(config, audit, output, **call)
    rows = pq.read_table(output / "run" / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in rows] == list(range(12)) and rows[:7] == kept
    assert len({row["seed"] for row in rows}) == 12  # each step drawn once
    resumed = json.loads(secret.read_text())
    same = [key for key in drawn if key != "tuned_losses"]  # canaries, coins, references
    assert {key: resumed[key] for key in same} == {key: drawn[key] for key in same}
    assert drawn["tuned_losses"] is None and len(resumed["tuned_losses"]) == 20
    trained = (output / "run" / "trajectory.parquet").stat().st_mtime_ns

    record = run_audit(config, audit, output, **call)
    assert (output / "run" / "trajectory.parquet").stat().st_mtime_ns == trained
    assert record.audited_run_id == killed and record.canaries_in == sum(drawn["included"])
    uri = f"sqlite:///{output / 'mlflow.db'}"
    assert read_run(uri, killed)["status"] == "FINISHED"
    client = open_client(uri)
    for run_id in (killed, record.tracking_run_id):
        names = [a.path for a in client.list_artifacts(run_id)]
        assert DRAW_FILE not in names and "included" not in json.dumps(
            client.get_run(run_id).data.params
        )
    assert "included" not in (output / AUDIT_FILE).read_text()

    _interrupt(monkeypatch, TrainingLoop, "step", lambda args: args[1] == 2)
    with pytest.raises(KeyboardInterrupt):  # --overwrite: a new run, with a draw of its own
        run_audit(config, audit, output, overwrite=True, **call)
    assert not (output / AUDIT_FILE).exists()  # no longer the record of the directory's run
    assert json.loads(secret.read_text())["canaries"] != drawn["canaries"]
    assert pq.read_table(output / "run" / "trajectory.parquet").num_rows == 2


@pytest.mark.parametrize(
    ("extra", "audit", "message"),
    [
        ((), {"canaries": 65}, "more canaries than the 64 private training rows"),
        (("parallel.strategy=replica", "parallel.workers=2"), {}, "parallel.strategy='replica'"),
        (("task.name=squad",), {}, "generates answers"),
        ((), {"canaries": 20, "ks": [11]}, r"2k ≤ canaries=20"),
    ],
)
def test_bad_input_is_refused_before_training(
    tmp_path, tiny_run_config, cache_dir, extra, audit, message
):
    config = tiny_run_config(*AUDIT_RUN, *extra)
    with pytest.raises(ConfigError, match=message):
        run_audit(config, AuditConfig(**audit), tmp_path / "a", cache_dir=cache_dir)
    assert not (tmp_path / "a" / "run").exists()  # nothing trained, nothing written


def test_several_directions_per_step_are_audited_white_box(tiny_run_config):
    config = tiny_run_config("optimizer.directions_per_step=2", "privacy.noise_grid=null")
    assert audit_scores(config, AuditConfig()) == (["white-box-directional"], None)
    assert audit_scores(tiny_run_config(), AuditConfig()) == (["white-box-directional"], None)
    chosen = AuditConfig(scores=["white-box-match", "black-box"])
    assert audit_scores(config, chosen) == (["white-box-match", "black-box"], None)


@pytest.mark.parametrize("alpha", ["0", "1", "1.5", "-0.1"])
def test_cli_refuses_alpha_outside_zero_one(tmp_path, sentiment_files, capsys, alpha):
    train, _ = sentiment_files
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{name_or_path: tiny-opt}}\ntask: {{train_path: {train}}}\n")
    code = main(["audit", str(config), "--alpha", alpha, "--output-dir", str(tmp_path / "a")])
    assert code == 2
    assert "alpha" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_white_box_scores_rank_a_planted_canary_first():
    """Synthetic trace: canary 0 was in the (noise-free) sum at every third step."""
    rng = np.random.default_rng(0)
    differences = rng.normal(size=(300, 8))
    others = rng.normal(scale=3.0, size=300)
    sampled = np.arange(300) % 3 == 0
    totals = others + sampled * differences[:, 0]
    trace = WhiteBoxTrace(differences, totals / 4)  # g = G / B with B = 4
    assert np.argmax(correlation_scores(trace)) == 0
    assert np.argmax(likelihood_scores(trace, batch_size=4, sample_rate=1 / 3)) == 0
    exact = WhiteBoxTrace(differences, np.where(sampled, differences[:, 0], others) / 4)
    scores = match_scores(exact, batch_size=4)
    assert scores[0] > 20 and np.all(scores[1:] < 10)  # an exact match against near misses


def test_match_score_skips_the_steps_that_clipped_a_canary():
    """A step that sampled one clipped example releases exactly C, which every canary clipped
    there matches: only canary 0's unclipped difference, released alone, is a match."""
    rng = np.random.default_rng(0)
    differences = np.clip(rng.normal(scale=15.0, size=(300, 8)), -20.0, 20.0)
    others = rng.normal(scale=3.0, size=300)
    totals = np.where(np.arange(300) % 3 == 0, differences[:, 0], others)
    clipped_steps = np.flatnonzero(np.abs(differences[:, 1]) >= 20.0)
    totals[clipped_steps] = differences[clipped_steps, 1]  # a lone out-row clipped like canary 1
    trace = WhiteBoxTrace(differences, totals / 4)
    assert match_scores(trace, 4)[1] > 20  # unclipped scoring: canary 1 looks released
    scores = match_scores(trace, 4, clip=20.0)
    assert scores[0] > 20 and np.all(scores[1:] < 10)


def test_scores_are_compared_within_a_label():
    scores = np.array([10.0, 11.0, 12.0, -5.0, -4.0, -3.0])
    labels = np.array([1, 1, 1, 0, 0, 0])
    centred = centre_by_label(scores, labels)
    assert np.allclose(centred[:3], centred[3:])  # the per-label offset is gone
    assert np.argsort(centred[:3]).tolist() == [0, 1, 2]


def synthetic_release(seed: int, in_release: bool = True):
    """A ZO release shaped like an audit's: each canary's d_c(θ_t) is its label's shared
    direction plus its own (of a scale that varies 5-fold across canaries); the released g_t is
    the data's large shared part, the sampled in-canaries' d_c and noise, over the batch."""
    rng = np.random.default_rng(seed)
    steps, canaries, batch = 20000, 200, 8
    labels = np.arange(canaries) % 2
    included = rng.permutation(np.arange(canaries) % 4 < 2)
    scale = np.exp(rng.uniform(0.0, np.log(5.0), size=canaries))
    shared = rng.normal(scale=5.0, size=(steps, 2))
    differences = shared[:, labels] + rng.normal(size=(steps, canaries)) * scale
    sampled = (rng.random((steps, canaries)) < 0.02) & included & in_release
    total = (differences * sampled).sum(axis=1) + 20 * shared[:, 0] + rng.normal(size=steps)
    return WhiteBoxTrace(differences, total / batch), labels, included


def right_guesses(scores: np.ndarray, included: np.ndarray, k: int) -> int:
    order = np.argsort(scores)
    return int(included[order[-k:]].sum() + (~included[order[:k]]).sum())


def test_directional_score_sees_in_canaries_the_correlation_misses():
    """Guessing 20 'in' and 20 'out' of 200 canaries, both scores compared within a label."""
    trace, labels, included = synthetic_release(0)
    directional = centre_by_label(directional_scores(trace, labels), labels)
    correlation = centre_by_label(correlation_scores(trace), labels)
    # of 40 guesses (chance: 20): 33 against 26 when written
    assert right_guesses(directional, included, 20) >= 32
    assert right_guesses(correlation, included, 20) <= 28


def test_directional_score_of_a_release_without_canaries_is_standard_normal():
    trace, labels, _ = synthetic_release(1, in_release=False)
    scores = centre_by_label(directional_scores(trace, labels), labels)
    assert abs(scores.mean()) < 0.35 and 0.7 < scores.std() < 1.3


def test_one_direction_scores_are_the_scalar_formulas_exactly():
    """K = 1: each score is its one-scalar-per-step formula, to the last bit."""
    rng = np.random.default_rng(3)
    differences, gradients = rng.normal(size=(50, 6)), rng.normal(size=50)
    labels = np.arange(6) % 2
    trace = WhiteBoxTrace(differences, gradients)
    assert np.array_equal(correlation_scores(trace), gradients @ differences)
    totals = gradients * 4
    gaps = np.abs(totals[:, None] - differences).min(axis=0) / float(np.std(totals))
    assert np.array_equal(match_scores(trace, 4), -np.log(gaps + 1e-12))
    center, variance = float(np.mean(totals)), float(np.var(totals))
    shift = ((totals - center)[:, None] * differences - differences**2 / 2) / variance
    mixture = np.logaddexp(np.log1p(-0.1), np.log(0.1) + shift).sum(axis=0)
    assert np.array_equal(likelihood_scores(trace, 4, 0.1), mixture)
    products = unshared_gradients(trace, labels) * differences
    spread = np.sqrt((products**2).sum(axis=0))
    assert np.array_equal(directional_scores(trace, labels), products.sum(axis=0) / spread)


def k_direction_release(seed: int, directions: int = 3):
    """Canary 0 was in the noise-free sum at every third step: G_t = its clipped K-vector plus
    the others' (rows: a step's K directions together)."""
    rng = np.random.default_rng(seed)
    steps, canaries = 300, 8
    differences = rng.normal(size=(steps * directions, canaries))
    others = rng.normal(scale=3.0, size=steps * directions)
    sampled = np.repeat(np.arange(steps) % 3 == 0, directions)
    return differences, others, sampled


def test_k_direction_scores_rank_a_planted_canary_first():
    differences, others, sampled = k_direction_release(0)
    trace = WhiteBoxTrace(differences, (others + sampled * differences[:, 0]) / 4, directions=3)
    labels = np.arange(8) % 2
    assert np.argmax(correlation_scores(trace)) == 0
    assert np.argmax(directional_scores(trace, labels)) == 0
    assert np.argmax(likelihood_scores(trace, batch_size=4, sample_rate=1 / 3)) == 0
    exact = WhiteBoxTrace(differences, np.where(sampled, differences[:, 0], others) / 4, 3)
    scores = match_scores(exact, batch_size=4)
    assert scores[0] > 20 and np.all(scores[1:] < 10)
    # one coordinate of the step off: the K-vector no longer matches exactly
    shifted = np.where(sampled, differences[:, 0], others)
    shifted[np.flatnonzero(sampled)[1::3]] += 1.0
    assert match_scores(WhiteBoxTrace(differences, shifted / 4, 3), batch_size=4)[0] < 10


def test_a_trace_of_broken_steps_is_refused():
    with pytest.raises(ValueError, match="whole steps of 3 directions"):
        WhiteBoxTrace(np.zeros((10, 2)), np.zeros(10), directions=3)


def test_the_replay_clips_each_canarys_k_vector_as_training_clips_each_examples():
    rng = np.random.default_rng(1)
    steps = rng.normal(scale=2.0, size=(40, 3, 5))  # [steps, K, canaries]
    steps[0, :, 0] = 0.0  # a zero vector stays zero
    rows = steps.reshape(120, 5)
    clipped = clip_as_trained(rows, 1.5, 3).reshape(40, 3, 5)
    estimator = PrivateEstimator("gaussian", 1.5, 1.0, 4.0)
    for canary in range(5):
        trained = estimator.clip_each(torch.from_numpy(steps[:, :, canary])).numpy()
        np.testing.assert_allclose(clipped[:, :, canary], trained, rtol=1e-13, atol=0)
    assert np.linalg.norm(clipped, axis=1).max() <= 1.5 * (1 + 1e-12)
    assert np.array_equal(
        clip_as_trained(rows[:, :1].copy(), 1.5, 1), np.clip(rows[:, :1], -1.5, 1.5)
    )


def test_a_private_k_direction_run_is_audited_white_box_and_consistent(
    tmp_path, tiny_run_config, cache_dir
):
    config = tiny_run_config(*K_AUDIT, "privacy.noise_grid=null", "privacy.accountant=rdp")
    record = run_audit(config, AuditConfig(canaries=40), tmp_path / "a", cache_dir=cache_dir)
    assert list(record.results) == ["white-box-directional"] and record.white_box is True
    assert record.verdict == "consistent"
    assert record.epsilon_claimed == pytest.approx(3.0, rel=0.01)
    assert 0 <= record.epsilon_lower_bound < 2.5
