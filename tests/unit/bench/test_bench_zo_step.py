"""`privzo bench zo-step`: every case measured, ratios formed from the measured figures, MeZO's
reference step as its paper writes it, and requests the machine cannot run refused first."""

from __future__ import annotations

import json

import pytest
import torch

from privzo.bench.mezo_reference import mezo_reference_step
from privzo.bench.report import FamilyStep, FamilyStepReport
from privzo.cli import main
from privzo.models.architecture import DecoderArch
from privzo.models.shapes import random_model

SMALL = ["--batch-size", "2", "--seq-len", "16", "--repeats", "1"]
CASES = {"forward", "dpzero", "mezo", "mezo_reference", "one_sweep", "read_write", "host_batch"}


def _bench_json(capsys, *arguments: str) -> dict:
    assert main(["bench", "zo-step", "--json", *SMALL, *arguments]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_case_is_measured_and_every_ratio_is_formed_from_the_measurements(capsys):
    result = _bench_json(capsys)
    assert result["shape"] == "tiny" and result["dtype"] == "float32"
    assert set(result["seconds"]) == CASES | {"one_sweep_philox"}
    assert all(seconds > 0 for seconds in result["seconds"].values())
    assert all(peak > 0 for peak in result["peak_memory_mb"].values())
    seconds, ratios = result["seconds"], result["ratios"]
    assert ratios["dpzero_over_mezo_reference_time"] == pytest.approx(
        seconds["dpzero"] / seconds["mezo_reference"]
    )
    assert ratios["sweep_over_read_write_time"] == pytest.approx(
        seconds["one_sweep"] / seconds["read_write"]
    )
    assert ratios["host_batch_over_dpzero_time"] == pytest.approx(
        seconds["host_batch"] / seconds["dpzero"]
    )
    assert "dpzero / MeZO reference step (time)" in result["table"]
    assert result["directions"] == 1
    assert not any(name.startswith("dpzero_k") for name in ratios)  # one direction: no K-step


def test_several_directions_are_measured_beside_dpzero_and_set_against_k_steps(capsys):
    result = _bench_json(capsys, "--directions", "3")
    assert result["directions"] == 3
    assert set(result["seconds"]) == CASES | {"one_sweep_philox", "dpzero_k"}
    seconds, peaks, ratios = result["seconds"], result["peak_memory_mb"], result["ratios"]
    assert ratios["dpzero_k_over_k_dpzero_time"] == pytest.approx(
        seconds["dpzero_k"] / (3 * seconds["dpzero"])
    )
    assert ratios["dpzero_k_over_dpzero_memory"] == pytest.approx(
        peaks["dpzero_k"] / peaks["dpzero"]
    )
    table = result["table"]
    assert "dpzero_k: K = 3" in table
    time_row = next(line for line in table.splitlines() if "(K x dpzero) (time)" in line)
    assert f"{ratios['dpzero_k_over_k_dpzero_time']:.3f}" in time_row and "<= 1.05" in time_row
    memory_row = next(line for line in table.splitlines() if "dpzero_k / dpzero" in line)
    assert f"{ratios['dpzero_k_over_dpzero_memory']:.3f}" in memory_row
    assert "<= 1.01" in memory_row


def test_half_precision_runs_the_virtual_step_and_the_reference(capsys):
    result = _bench_json(capsys, "--dtype", "bf16")
    assert result["dtype"] == "bfloat16" and set(result["seconds"]) == CASES


def test_families_time_each_familys_tiny_shape_and_set_its_step_against_opts(capsys):
    result = _bench_json(capsys, "--families")
    families = {step["family"]: step for step in result["families"]}
    assert list(families) == ["opt", "llama", "qwen2", "mistral"]
    assert [step["shape"] for step in result["families"]] == [
        "tiny",
        "tiny-llama",
        "tiny-qwen2",
        "tiny-mistral",
    ]
    for step in families.values():
        assert step["forward_s"] > 0 and step["dpzero_s"] > 0
        assert step["step_over_two_forwards"] == pytest.approx(
            step["dpzero_s"] / (2 * step["forward_s"])
        )
    over_opt = result["step_over_opt_step"]
    assert over_opt["opt"] == 1.0
    assert over_opt["llama"] == pytest.approx(
        families["llama"]["step_over_two_forwards"] / families["opt"]["step_over_two_forwards"]
    )
    assert result["targets"]["family_step_over_opt_step"]["cpu"] == 1.10
    # the family shapes have tiny's sizes, so their steps sweep about as many weights
    assert all(
        0.9 < step["parameters"] / families["opt"]["parameters"] < 1.0
        for step in result["families"][1:]
    )


def test_the_families_table_gives_each_family_its_verdict_against_opts_step():
    def step(shape: str, family: str, dpzero_s: float) -> FamilyStep:
        return FamilyStep(shape, family, 5_000_000, forward_s=0.01, dpzero_s=dpzero_s)

    report = FamilyStepReport(
        "cpu", "cpu", "float32", 16, 128, 2, 5,
        (step("tiny", "opt", 0.03), step("tiny-llama", "llama", 0.032),
         step("tiny-qwen2", "qwen2", 0.0331)),
    )  # fmt: skip
    assert report.over_opt() == pytest.approx(
        {"opt": 1.0, "llama": 1.6 / 1.5, "qwen2": 1.655 / 1.5}
    )
    rows = {line.split()[0]: line for line in report.table().splitlines()[2:5]}
    assert rows["tiny"].endswith("-")
    assert rows["tiny-llama"].endswith("<= 1.1  ok") and "1.600" in rows["tiny-llama"]
    assert rows["tiny-qwen2"].endswith("ABOVE TARGET")
    cuda = FamilyStepReport("cuda:0", "H100", "bfloat16", 16, 128, 2, 5, report.families)
    assert not any(verdict in cuda.table() for verdict in ("  ok", "ABOVE TARGET"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--families", "--shape", "opt-125m"], "--families runs each family's tiny shape"),
        (["--families", "--directions", "2"], "drop --shape and --directions"),
        (["--shape", "opt-66b"], "shape opt-66b (float32, batch 16 x 128) needs about"),
        (["--shape", "opt-3b"], "unknown shape 'opt-3b'"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--seq-len", "257"], "tiny has 256 positions"),
        (["--batch-size", "0"], "--batch-size=0"),
        (["--device", "tpu"], "--device='tpu'"),
        (["--directions", "0"], "--directions=0: allowed: 1..1024"),
    ],
)
def test_requests_the_machine_cannot_run_are_refused(capsys, arguments, message):
    assert main(["bench", "zo-step", *arguments]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "building" not in captured.out  # refused before any model was built


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_is_refused_without_cuda(capsys):
    assert main(["bench", "zo-step", "--device", "cuda"]) == 2
    assert "has no CUDA" in capsys.readouterr().err


def test_the_mezo_reference_step_moves_the_weights_by_minus_lr_g_z():
    """z is MeZO's: torch's global generator seeded with the step's seed, one torch.normal per
    parameter in order; the four sweeps leave θ − lr·g·z (to fp32 rounding of the ±ε sweeps)."""
    model = random_model(
        DecoderArch(layers=1, hidden=16, ffn=32, heads=2, vocab=64, max_positions=16)
    )
    parameters = list(model.parameters())
    before = [parameter.detach().clone() for parameter in parameters]
    inputs = torch.randint(0, 64, (2, 8))

    def loss() -> torch.Tensor:
        return model(input_ids=inputs).logits[:, -1].logsumexp(-1)

    gradient = mezo_reference_step(parameters, seed=3, loss=loss, eps=1e-3, learning_rate=1e-2)
    assert gradient != 0
    torch.manual_seed(3)
    for parameter, start in zip(parameters, before, strict=True):
        z = torch.normal(mean=0, std=1, size=start.size())
        expected = start - 1e-2 * gradient * z
        torch.testing.assert_close(parameter.data, expected, rtol=0, atol=1e-5)
