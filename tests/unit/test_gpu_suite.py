"""The GPU suite's CPU-side pieces: tests/gpu collects and skips without CUDA, the one-call check
claims nothing without a GPU, its report renders real measurements, its wheel list is pinned and
meets privzo's requirements, and the GPU path imports and runs without Ray, MLflow, DeepSpeed or
Opacus (the bare GPU nodes it is meant for lack them)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import tomllib
import torch
from packaging.requirements import Requirement

from conftest import REPO

if torch.cuda.is_available():  # pragma: no cover - CI has no GPU
    pytest.skip("these check the suite where no GPU is visible", allow_module_level=True)

ABSENT_ON_GPU_NODES = ("ray", "mlflow", "deepspeed", "opacus")
# what DeepSpeed needs that GPU images have (docs/gpu.md lists what the suite expects there)
IN_GPU_IMAGES = {"numpy", "torch", "tqdm"}


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_gpu_tests_are_collected_and_skipped_without_cuda():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-rs", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 skipped" in done.stdout, done.stdout  # the kernels, 4 runs replayed
    assert "no CUDA device visible" in done.stdout


def test_the_gpu_tests_are_not_in_the_default_suites():
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "not gpu" in options["addopts"]
    assert "gpu:" in " ".join(options["markers"])
    ci = (REPO / ".ci" / "run").read_text()
    assert '-m "slow or ray or integration"' in ci  # the marked run selects no gpu test


@pytest.mark.slow
def test_the_check_without_a_gpu_says_so_and_claims_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, "tools/gpu_check.py", "--output-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert "no CUDA device visible: nothing was checked" in done.stdout
    assert json.loads((tmp_path / "gpu-check.json").read_text()) == {
        "checked": False,
        "reason": "no CUDA device visible",
    }
    assert not (tmp_path / "gpu-check.md").exists()


@pytest.mark.slow
def test_the_report_renders_measured_benchmarks_and_kernel_checks(tmp_path):
    """A CPU benchmark and a CPU (interpreter) kernel check through the same code the GPU call
    uses: each row shows the measured figures."""
    from privzo.bench.kernel_check import check_kernels

    gpu_check = _gpu_check_module()
    check = gpu_check.Check(tmp_path, deadline=float("inf"))
    check.environment = gpu_check.environment("cpu")
    entry = gpu_check.run_bench(check, gpu_check.Bench("tiny", "float32", 32, "cpu"), repeats=1)
    assert entry["status"] == "passed", entry.get("error")
    kernels = check_kernels(torch.device("cpu"), size=256, projection_size=4096, projection_steps=4)
    check.records_path.write_text(json.dumps({"part": "kernels", **kernels.to_json()}) + "\n")
    check.write()
    table = (tmp_path / "gpu-check.md").read_text()
    seconds = entry["result"]["seconds"]
    assert f"| tiny float32 16x32 | {seconds['forward']:.4f} | {seconds['dpzero']:.4f} |" in table
    assert "| sign directions | float32 | 256 | 0 | 0 | bit-exact |" in table
    record = json.loads((tmp_path / "gpu-check.json").read_text())
    assert record["benchmarks"][0]["result"]["ratios"] == entry["result"]["ratios"]


def test_the_wheel_list_is_pinned_and_meets_privzos_requirements():
    lines = (REPO / "tools" / "gpu-wheels.txt").read_text().splitlines()
    pins = {
        Requirement(line).name: Requirement(line)
        for line in lines
        if line.strip() and not line.startswith("#")
    }
    for requirement in pins.values():
        assert (
            len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "=="
        )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {Requirement(spec).name: Requirement(spec) for spec in project["dependencies"]}
    for name in ("pydantic", "dp-accounting"):  # privzo's own needs the bare nodes lack
        version = next(iter(pins[name].specifier)).version
        assert wanted[name].specifier.contains(version), (name, version)
    assert {"pytest", "pydantic-core", "dm-tree"} <= pins.keys()
    assert not pins.keys() & set(ABSENT_ON_GPU_NODES)


def test_deepspeed_is_built_at_the_version_tested_with_what_it_needs_carried():
    """The offloaded ZeRO-3 step needs DeepSpeed, built from its source release (PyPI has no
    wheel) at the version the tests run, with every requirement a GPU image lacks."""
    from importlib.metadata import requires, version

    lines = (REPO / "tools" / "gpu-sdists.txt").read_text().splitlines()
    built = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert [(r.name, str(r.specifier)) for r in built] == [
        ("deepspeed", f"=={version('deepspeed')}")
    ]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(spec) for spec in project["dependencies"]]
    assert next(r for r in wanted if r.name == "deepspeed").specifier.contains(version("deepspeed"))
    lines = (REPO / "tools" / "gpu-wheels.txt").read_text().splitlines()
    pins = {Requirement(line).name for line in lines if line.strip() and not line.startswith("#")}
    needed = {r.name for r in map(Requirement, requires("deepspeed") or []) if not r.marker}
    assert needed - pins == IN_GPU_IMAGES & needed


def test_the_offload_part_is_listed_and_rendered():
    gpu_check = _gpu_check_module()
    assert "offload" in gpu_check.PARTS
    assert gpu_check.FIRST_OFFLOAD.name == "opt-1.3b float16 16x128 offload cpu"
    lines = gpu_check._offload_lines(
        [{"case": gpu_check.FIRST_OFFLOAD.name, "status": "not run (budget spent)"}]
    )
    assert lines[0].startswith("## ZeRO-3 with its weights in host memory")
    assert "| GPU peak MiB | planner GPU MiB | GPU peak/planner |" in lines[2]
    assert lines[-1].startswith("| opt-1.3b float16 16x128 offload cpu | not run (budget spent) |")
    assert lines[-1].count("|") == len(gpu_check.OFFLOAD_COLUMNS) + 1


# The commands in one interpreter, one after another (each an argv, as JSON on the command line),
# stopping at the first that fails: one import of torch and transformers, not one per command.
BLOCKED_CLI = (
    "import json, sys; sys.modules.update(dict.fromkeys({blocked!r})); "
    "from privzo.cli import main\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    code = main(argv)\n"
    "    if code:\n"
    "        sys.exit(f'privzo {{argv[0]}}: exit code {{code}}')"
)


@pytest.mark.slow
def test_the_gpu_path_runs_without_ray_mlflow_deepspeed_or_opacus(tmp_path):
    """What tests/gpu runs, with those packages made unimportable: models init, a DPZero run
    with tracking.backend=none, and its replay."""
    cli = [sys.executable, "-c", BLOCKED_CLI.format(blocked=ABSENT_ON_GPU_NODES)]
    config = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
    commands = [
        ["models", "init", "--shape", "tiny", "--output-dir", str(tmp_path / "base")],
        ["run", str(config), f"model.name_or_path={tmp_path / 'base'}", "tracking.backend=none",
         "optimizer.steps=1", "task.test_size=16", "optimizer.generator=philox",
         "--output-dir", str(tmp_path / "run")],
        ["replay", "--base", str(tmp_path / "base"), "--trajectory",
         str(tmp_path / "run" / "trajectory.parquet"), "--output-dir", str(tmp_path / "replay")],
    ]  # fmt: skip
    done = subprocess.run(
        [*cli, json.dumps(commands)], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "replay" / "model.safetensors").exists()


def test_the_larger_offloaded_shape_is_the_largest_whose_estimated_time_fits():
    """The first case's seconds per parameter scaled to each larger shape's parameters
    (OPT-6.7B: 6.66e9, OPT-2.7B: 2.65e9), with a fifth of the time left to spare."""
    gpu_check = _gpu_check_module()
    first = {"seconds": 100.0, "result": {"parameters": 1_300_000_000}}
    shape, estimate, fits = gpu_check.larger_offload(first, remaining=1000.0)
    assert (shape, fits) == ("opt-2.7b", True)  # OPT-6.7B's 512 s exceed a part's 300 s
    assert estimate == pytest.approx(204, abs=1)
    assert gpu_check.larger_offload(first, remaining=200.0)[1:] == (estimate, False)
    small = {"seconds": 20.0, "result": {"parameters": 1_300_000_000}}
    assert gpu_check.larger_offload(small, remaining=400.0)[::2] == ("opt-6.7b", True)
