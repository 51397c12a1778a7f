"""`privzo bench offload`: a ZeRO-3 step of a model built partitioned with its partitions in host
memory (real DeepSpeed, a world of one on CPU), measured, set beside the planner's figures for the
same plan, and its projected gradients those of the same model not offloaded; requests the
machine cannot hold are refused before anything is built."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import sys

import pytest

from conftest import REPO
from privzo.bench.offload import OffloadBench, offload_benchmark
from privzo.cli import main
from privzo.models.architecture import count_parameters
from privzo.models.shapes import resolve_shape
from privzo.planner import HOST_OVERHEAD_BYTES, plan

SMALL = ["--dtype", "float16", "--batch-size", "4", "--seq-len", "32", "--repeats", "1"]


@pytest.fixture(scope="module")
def records() -> dict[str, dict]:
    """The benchmark's JSON, offloaded and not, through the CLI in this process (one DeepSpeed
    import for both)."""
    found = {}
    for offload in ("cpu", "none"):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["bench", "offload", "--json", "--offload", offload, *SMALL]) == 0
        found[offload] = json.loads(printed.getvalue())
    return found


def _host_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


@pytest.mark.slow  # imports DeepSpeed and builds two partitioned models (about 20 s under load)
def test_the_offloaded_step_is_measured_beside_the_planners_figures(records):
    record = records["cpu"]
    assert (record["offload"], record["offload_param"], record["partitions_on"]) == (
        "cpu",
        "cpu",
        "cpu",
    )
    assert records["none"]["offload_param"] == "none"  # the engine keeps them on the device
    assert set(record["seconds"]) == {"forward", "mezo", "dpzero"}
    assert all(value > 0 for value in record["seconds"].values())
    assert all(value > 0 for value in record["host_peak_mb"].values())
    assert record["device_peak_mb"] is None  # on CPU the device is the host
    arch = resolve_shape("tiny")[1]
    assert record["parameters"] == count_parameters(arch)
    host = _host_gib()
    expected = plan(
        arch,
        gpus=1,
        gpu_memory_gb=host,
        dtype="float16",
        batch_size=4,
        seq_len=32,
        attention="sdpa",
        offload="cpu",
        host_memory_gb=host,
        forwards_per_step=2,
    )
    assert record["plan"] == expected.to_json()
    weights = 2 * count_parameters(arch)  # float16
    assert record["plan"]["host_bytes"] == weights + HOST_OVERHEAD_BYTES
    assert record["plan"]["offload_bytes_per_step"] == 2 * weights  # two forwards copy them in
    ratios, seconds = record["ratios"], record["seconds"]
    assert ratios["dpzero_step_over_two_forwards"] == pytest.approx(
        seconds["dpzero"] / (2 * seconds["forward"])
    )
    step_host = max(record["host_peak_mb"]["mezo"], record["host_peak_mb"]["dpzero"])
    assert ratios["host_peak_over_planner"] == pytest.approx(
        step_host * 2**20 / record["plan"]["host_bytes"]
    )
    assert ratios["device_peak_over_planner"] is None
    assert records["none"]["ratios"]["host_peak_over_planner"] is None  # nothing offloaded
    assert "host peak" in record["table"]


@pytest.mark.slow
def test_the_projected_gradients_are_finite_and_those_of_the_model_not_offloaded(records):
    offloaded, resident = records["cpu"], records["none"]
    for record in (offloaded, resident):
        gradients = record["projected_gradients"]
        assert [len(gradients["mezo"]), len(gradients["dpzero"])] == [2, 2]  # warm-up + 1
        assert all(math.isfinite(g) for values in gradients.values() for g in values)
    # the first MeZO step precedes any DPZero noise: the same weights, batch and seed, and on
    # one CPU the same arithmetic, offloaded or not
    first = offloaded["projected_gradients"]["mezo"][0]
    assert first != 0.0
    assert first == resident["projected_gradients"]["mezo"][0]


@pytest.mark.slow
def test_the_gpu_checks_table_shows_the_offloaded_measurement(records, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check
    spec.loader.exec_module(gpu_check)
    check = gpu_check.Check(tmp_path, deadline=float("inf"))
    check.environment = gpu_check.environment("cpu")
    result = {key: value for key, value in records["cpu"].items() if key != "table"}
    check.offload.append({"case": "tiny float16 4x32", "status": "passed", "result": result})
    check.write()
    table = (tmp_path / "gpu-check.md").read_text()
    seconds, plan_bytes = result["seconds"], result["plan"]["host_bytes"] / 2**20
    row = f"| tiny float16 4x32 | {seconds['forward']:.3f} | {seconds['dpzero']:.3f} |"
    assert row in table
    assert f"| {plan_bytes:,.0f} | {result['ratios']['host_peak_over_planner']:.3f} |" in table
    assert json.loads((tmp_path / "gpu-check.json").read_text())["offload"][0]["result"] == result


@pytest.mark.parametrize(
    ("bench", "message"),
    [
        (OffloadBench(shape="opt-66b", dtype="float32"), "needs about"),
        (OffloadBench(shape="opt-66b", offload="none"), "needs about"),
        (OffloadBench(device="tpu"), "--device='tpu'"),
        (OffloadBench(shape="tiny", seq_len=10_000), "--seq-len=10000"),
    ],
)
def test_what_the_machine_cannot_hold_is_refused_before_anything_is_built(bench, message):
    if _host_gib() > 1024:  # pragma: no cover - a host that holds OPT-66B in float32
        pytest.skip("this host holds OPT-66B")
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        offload_benchmark(bench)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repeats": 0}, "--repeats=0"),
        ({"offload": "nvme"}, "--offload='nvme': allowed: cpu, none"),
    ],
)
def test_values_without_meaning_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        OffloadBench(**values)
