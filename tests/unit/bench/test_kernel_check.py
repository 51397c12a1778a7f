"""``privzo bench kernels`` on CPU tensors under Triton's interpreter (conftest sets it): the same
checks the GPU suite makes on CUDA, and the command's refusals."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton", reason="the kernel checks need triton (the test extra)")

from privzo.cli import main


def test_the_command_prints_json_and_exits_by_the_verdict(capsys):
    small = ["--size", "300", "--projection-size", "1024", "--projection-steps", "2"]
    code = main(["bench", "kernels", "--device", "cpu", *small, "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == (0 if record["passed"] else 1)
    assert [a["check"] for a in record["agreements"] if not a["passed"]] == []
    assert {"sign directions", "normal directions"} <= {a["check"] for a in record["agreements"]}
    assert len(record["projections"]) == 6  # bf16 and fp16 at three magnitudes


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--device", "tpu"], "--device='tpu': allowed: cpu, cuda"),
        (["--device", "cpu", "--size", "10"], "size=10: allowed: 64 or more"),
    ],
)
def test_bad_requests_are_refused_before_any_kernel_runs(arguments, message, capsys):
    assert main(["bench", "kernels", *arguments]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_cuda_is_refused_where_there_is_none(capsys):
    assert main(["bench", "kernels", "--device", "cuda"]) == 2
    assert "has no CUDA" in capsys.readouterr().err
