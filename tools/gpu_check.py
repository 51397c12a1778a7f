"""The GPU suite in one call: tests/gpu, the zo-step benchmarks and a ZeRO-3 step with its weights
offloaded to host memory, one JSON file and one table. Its runs and benchmarks cover OPT and one
Llama-family model each.

Run through ``tools/gpu-check.sh`` (which installs the carried wheels first). Each part is a
separate process with its own time limit, in priority order, so a crash, an out-of-memory or
the overall budget running out costs only the parts after it; whatever finished is written.
Without a visible CUDA device it says so, writes a record that claims nothing, and exits 0.

Exit status: 0 when every part that ran passed, 1 when a test failed or a part did not finish.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JSON_NAME, TABLE_NAME = "gpu-check.json", "gpu-check.md"


@dataclass(frozen=True)
class Bench:
    """One ``privzo bench zo-step`` case (batch 16); on CUDA but in the suite's own tests."""

    shape: str
    dtype: str
    seq_len: int = 128
    device: str = "cuda"

    @property
    def name(self) -> str:
        return f"{self.shape} {self.dtype} 16x{self.seq_len}"


# Priority order: the case the CUDA targets are set for first, the largest shape that fits
# last. Llama-3.1-8B in bfloat16, as it ships, takes the step through another family's modules
# (grouped key/value heads, gated MLP, RMSNorm) at a published size.
FIRST_BENCHES = (Bench("opt-13b", "float16"), Bench("opt-1.3b", "float16"))
LATER_BENCHES = (
    Bench("opt-13b", "bfloat16"),
    Bench("llama-3.1-8b", "bfloat16"),
    Bench("opt-13b", "float16", 512),
)
LARGEST_CANDIDATES = ("opt-66b", "opt-30b")  # the first whose fit check passes is measured


@dataclass(frozen=True)
class Offload:
    """One ``privzo bench offload`` case (batch 16, partitions in host memory, one process): one
    timed round after the warm-up, as each offloaded step sweeps every weight on the host."""

    shape: str
    dtype: str = "float16"
    seq_len: int = 128
    device: str = "cuda"
    repeats: int = 1

    @property
    def name(self) -> str:
        return f"{self.shape} {self.dtype} 16x{self.seq_len} offload cpu"


FIRST_OFFLOAD = Offload("opt-1.3b")
# Measured last, the first of these whose time (the first case's, scaled by the parameters)
# fits what is left of the budget.
LARGER_OFFLOADS = ("opt-6.7b", "opt-2.7b")
# What --parts selects: the kernel tests, the benchmarks, the runs replayed on CPU, the offloaded
# ZeRO-3 step, the largest shape; they run interleaved in priority order (kernels, the first
# benchmarks, runs, the first offload case, the later benchmarks, the largest, a larger offload).
PARTS = ("kernels", "bench", "runs", "offload", "largest")


@dataclass
class Check:
    """What one call of the suite found, written as it goes."""

    output_dir: Path
    deadline: float
    environment: dict[str, Any] = field(default_factory=dict)
    parts: list[dict[str, Any]] = field(default_factory=list)
    benchmarks: list[dict[str, Any]] = field(default_factory=list)
    offload: list[dict[str, Any]] = field(default_factory=list)

    @property
    def records_path(self) -> Path:
        return self.output_dir / "records.jsonl"

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def records(self) -> list[dict[str, Any]]:
        if not self.records_path.exists():
            return []
        return [json.loads(line) for line in self.records_path.read_text().splitlines() if line]

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": True,
            "environment": self.environment,
            "parts": self.parts,
            "records": self.records(),
            "benchmarks": self.benchmarks,
            "offload": self.offload,
            "passed": all(part["status"] in ("passed", "skipped") for part in self.parts),
        }

    def write(self) -> None:
        (self.output_dir / JSON_NAME).write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (self.output_dir / TABLE_NAME).write_text(render_table(self.to_json()) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("gpu-check"))
    parser.add_argument("--budget-s", type=float, default=480.0, help="overall time limit")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per benchmark")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {', '.join(PARTS)} (default: all, in that priority order)",
    )
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if not parts or any(part not in PARTS for part in parts):
        parser.error(f"--parts={args.parts!r}: allowed: a comma-separated subset of {list(PARTS)}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    gpu = _gpu_name()
    if gpu is None:
        print("no CUDA device visible: nothing was checked (the GPU suite needs one)")
        record = {"checked": False, "reason": "no CUDA device visible"}
        (args.output_dir / JSON_NAME).write_text(json.dumps(record, indent=2) + "\n")
        return 0
    check = Check(args.output_dir, time.monotonic() + args.budget_s)
    check.records_path.unlink(missing_ok=True)
    check.environment = environment(gpu)
    print(f"GPU check on {gpu}; output in {args.output_dir}", flush=True)
    if "kernels" in parts:
        run_tests(check, "tests/gpu/test_kernels.py", limit=180)
    for bench in FIRST_BENCHES if "bench" in parts else ():
        run_bench(check, bench, args.repeats)
    if "runs" in parts:
        run_tests(check, "tests/gpu/test_run_replay.py", limit=420)
    first_offload = run_offload(check, FIRST_OFFLOAD) if "offload" in parts else None
    for bench in LATER_BENCHES if "bench" in parts else ():
        run_bench(check, bench, args.repeats)
    if "largest" in parts:
        run_largest(check, args.repeats)
    if first_offload is not None and first_offload["status"] == "passed":
        run_larger_offload(check, first_offload)
    check.write()
    print(render_table(check.to_json()))
    return 0 if check.to_json()["passed"] else 1


def _gpu_name() -> str | None:
    probe = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return found.stdout.strip() or None


def environment(gpu: str) -> dict[str, Any]:
    """What the figures were measured with: date, GPU, driver, library versions, commit."""
    probe = (
        "import json, torch, triton, transformers; print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'triton': triton.__version__, "
        "'transformers': transformers.__version__, "
        "'gpu_memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 "
        "if torch.cuda.is_available() else 0.0}))"
    )
    versions = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    )
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "gpu": gpu,
        "driver": _command_output(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        ),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "commit": _command_output(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        **versions,
    }


def _command_output(command: list[str]) -> str | None:
    try:
        found = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout else None


def _environment_for_children(check: Check) -> dict[str, str]:
    return {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "PYTHONUNBUFFERED": "1",
        "PRIVZO_GPU_RECORD": str(check.records_path.resolve()),
    }


def _run(check: Check, name: str, command: list[str], limit: float) -> tuple[str, str, str, float]:
    """(status, stdout, stderr, seconds) of one part: passed, failed, timed out or not run."""
    allowed = min(limit, check.remaining())
    if allowed < 20:
        return "not run (budget spent)", "", "", 0.0
    print(f"[{name}] up to {allowed:.0f} s", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            env=_environment_for_children(check),
            capture_output=True,
            text=True,
            timeout=allowed,
        )
    except subprocess.TimeoutExpired as expired:
        print(f"[{name}] timed out after {allowed:.0f} s", flush=True)
        return (
            f"timed out after {allowed:.0f} s",
            _text(expired.stdout),
            _text(expired.stderr),
            (time.monotonic() - started),
        )
    seconds = time.monotonic() - started
    print(f"[{name}] exit {done.returncode} in {seconds:.0f} s", flush=True)
    status = "passed" if done.returncode == 0 else "failed"
    return status, done.stdout, done.stderr, seconds


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def run_tests(check: Check, path: str, limit: float) -> None:
    junit = check.output_dir / (Path(path).stem + ".xml")
    command = [sys.executable, "-m", "pytest", path, "-m", "gpu", "-q", "-rs", "-s"]
    command += ["-p", "no:cacheprovider", f"--junitxml={junit.resolve()}"]
    status, stdout, stderr, seconds = _run(check, path, command, limit)
    (check.output_dir / (Path(path).stem + ".log")).write_text(stdout + stderr)
    tests = _junit(junit)
    if status == "passed" and tests and all(t["outcome"] == "skipped" for t in tests):
        status = "skipped"  # nothing was checked: not a pass
    check.parts.append(
        {"part": path, "status": status, "seconds": round(seconds, 1), "tests": tests}
    )
    check.write()


def _junit(path: Path) -> list[dict[str, str]]:
    """Each test case's outcome from pytest's JUnit XML."""
    if not path.exists():
        return []
    cases = []
    for case in ElementTree.parse(path).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        cases.append({"test": case.get("name", "?"), "outcome": outcome})
    return cases


def _bench_command(subcommand: str, case: Bench | Offload, repeats: int) -> list[str]:
    """``privzo bench SUBCOMMAND`` of one case at batch 16, printing one JSON object."""
    command = [sys.executable, "-m", "privzo", "bench", subcommand, "--device", case.device]
    command += ["--shape", case.shape, "--dtype", case.dtype, "--seq-len", str(case.seq_len)]
    return [*command, "--batch-size", "16", "--repeats", str(repeats), "--json"]


def _run_measured(
    check: Check, name: str, part: str, command: list[str], limit: float, into: list
) -> dict[str, Any]:
    """One benchmark's process: its JSON (less the printed table and targets) or its output's
    tail, appended to ``into`` and recorded as part ``part``."""
    status, stdout, stderr, seconds = _run(check, name, command, limit)
    entry: dict[str, Any] = {"case": name, "status": status, "seconds": round(seconds, 1)}
    if status == "passed":
        result = json.loads(stdout)
        result.pop("table", None)
        result.pop("targets", None)
        entry["result"] = result
    else:
        entry["error"] = (stdout + stderr)[-2000:]
    into.append(entry)
    check.parts.append({"part": f"{part} {name}", "status": status, "seconds": entry["seconds"]})
    check.write()
    return entry


def run_bench(check: Check, bench: Bench, repeats: int, limit: float = 240) -> dict[str, Any]:
    command = _bench_command("zo-step", bench, repeats)
    return _run_measured(check, bench.name, "bench", command, limit, check.benchmarks)


def run_largest(check: Check, repeats: int) -> None:
    """The largest OPT shape whose fit check passes on this GPU (the bench refuses the others
    before it builds anything)."""
    for shape in LARGEST_CANDIDATES:
        entry = run_bench(check, Bench(shape, "float16"), repeats, limit=300)
        if entry["status"] == "passed" or "needs about" not in entry.get("error", ""):
            return
        check.benchmarks.pop()  # refused as too large: not a failure, try the next size
        check.parts.pop()


def run_offload(check: Check, case: Offload, limit: float = 300) -> dict[str, Any]:
    """One offloaded ZeRO-3 case; its record (the planner's figures beside the measured ones)."""
    command = _bench_command("offload", case, case.repeats)
    return _run_measured(check, case.name, "offload", command, limit, check.offload)


def larger_offload(first: dict[str, Any], remaining: float) -> tuple[str, float, bool]:
    """The largest of ``LARGER_OFFLOADS`` whose time, the first case's scaled by the parameters
    (a step sweeps every weight on the host and copies every weight in twice), fits in
    ``remaining`` seconds (at most a part's 300, with a fifth to spare): (shape, its estimated
    seconds, True); else the smallest of them, its estimate and False."""
    from privzo.models.architecture import count_parameters
    from privzo.models.shapes import resolve_shape

    scale = first["seconds"] / first["result"]["parameters"]
    for shape in LARGER_OFFLOADS:
        estimate = scale * count_parameters(resolve_shape(shape)[1])
        if estimate < min(remaining, 300) * 0.8:
            return shape, estimate, True
    return shape, estimate, False


def run_larger_offload(check: Check, first: dict[str, Any]) -> None:
    """``larger_offload``'s shape measured, or the record saying why none was."""
    shape, estimate, fits = larger_offload(first, check.remaining())
    if fits:
        run_offload(check, Offload(shape), limit=300)
        return
    check.parts.append(
        {
            "part": f"offload {Offload(shape).name}",
            "status": "skipped",
            "seconds": 0.0,
            "reason": f"about {estimate:.0f} s needed, "
            f"{max(0.0, check.remaining()):.0f} s of the budget left",
        }
    )
    check.write()


RATIO_COLUMNS = (
    ("dpzero_step_over_two_forwards", "step/2fwd", 1.5),
    ("dpzero_over_mezo_reference_time", "step/MeZO ref", 0.55),
    ("sweep_over_read_write_time", "sweep/rw", 2.2),
    ("dpzero_step_over_forward_memory", "mem step/fwd", 1.02),
    ("sweep_over_per_tensor_sweep_time", "sweep/per-tensor sweep", None),
)


def render_table(record: dict[str, Any]) -> str:
    """The readable form of the record, as Markdown."""
    env = record["environment"]
    lines = [
        f"# GPU check, {env['date_utc']} UTC",
        "",
        f"{env['gpu']} ({env['gpu_memory_gib']:.0f} GiB), driver {env['driver']}, CUDA "
        f"{env['cuda']}, torch {env['torch']}, triton {env['triton']}, transformers "
        f"{env['transformers']}, Python {env['python']}, commit {env['commit']}",
        "",
        "| part | status | seconds |",
        "|---|---|---|",
        *(f"| {p['part']} | {p['status']} | {p['seconds']} |" for p in record["parts"]),
    ]
    for record_line in record["records"]:
        if record_line["part"] == "kernels":
            lines += ["", *_kernel_lines(record_line)]
    replays = [r for r in record["records"] if r["part"] == "run_replay"]
    if replays:
        lines += ["", *_replay_lines(replays)]
    lines += ["", *_bench_lines(record["benchmarks"])]
    if record.get("offload"):
        lines += ["", *_offload_lines(record["offload"])]
    return "\n".join(lines)


def _kernel_lines(kernels: dict[str, Any]) -> list[str]:
    lines = [
        "## Kernels against the CPU twin",
        "",
        "| check | dtype | elements | differing | max abs error | tolerance |",
        "|---|---|---|---|---|---|",
    ]
    for a in kernels["agreements"]:
        lines.append(
            f"| {a['check']} | {a['dtype']} | {a['elements']} | {a['differing']} | "
            f"{a['max_abs_error']:.3g} | {a['tolerance']} |"
        )
    lines += ["", "| update projection | 1e-7 | 1e-6 | 1e-5 |", "|---|---|---|---|"]
    for dtype in ("bfloat16", "float16"):
        values = [p["value"] for p in kernels["projections"] if p["dtype"] == dtype]
        lines.append(f"| {dtype} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    return lines


def _replay_lines(replays: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## DPZero on CUDA, replayed on CPU",
        "",
        "| model | dtype | steps | ε (target) | replay on CPU |",
        "|---|---|---|---|---|",
    ]
    for r in replays:
        if r["dtype"] == "float32":
            agreement = f"worst error / tolerance {r['worst_error_over_tolerance']:.3g}"
        else:
            agreement = (
                f"{100 * r['flipped_fraction']:.3f} % of weights one rounding apart "
                f"(largest difference {r['largest_difference_in_tensor_ulps']:.2f} ulp of "
                "the tensor's largest weight)"
            )
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['steps']} | "
            f"{r['epsilon']:.4f} ({r['epsilon_target']}) | {agreement} |"
        )
    return lines


def _bench_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    columns = ["case", "forward s", "dpzero step s", "MeZO ref s", "sweep s", "read+write s"]
    columns += [
        label if bound is None else f"{label} (≤ {bound})" for _k, label, bound in RATIO_COLUMNS
    ]
    title = "ZO step against inference (`privzo bench zo-step`, batch 16, median of the repeats)"
    lines = _table_head(title, columns)
    for entry in benchmarks:
        if "result" not in entry:
            lines.append(_status_row(entry, columns))
            continue
        seconds, ratios = entry["result"]["seconds"], entry["result"]["ratios"]
        cells = [
            seconds[name]
            for name in ("forward", "dpzero", "mezo_reference", "one_sweep", "read_write")
        ]
        shown = [f"{value:.4f}" for value in cells]
        shown += [f"{ratios[key]:.3f}" if key in ratios else "-" for key, _l, _b in RATIO_COLUMNS]
        lines.append(f"| {entry['case']} | " + " | ".join(shown) + " |")
    return lines


OFFLOAD_COLUMNS = (
    "case",
    "forward s",
    "DPZero step s",
    "MeZO step s",
    "step/2fwd",
    "GPU peak MiB",
    "planner GPU MiB",
    "GPU peak/planner",
    "host peak MiB",
    "planner host MiB",
    "host peak/planner",
    "planner moved GiB/step",
    "GB/s in a forward",
)


def _offload_lines(entries: list[dict[str, Any]]) -> list[str]:
    """The offloaded cases: measured beside the planner (``privzo.planner.plan``, same plan)."""
    title = (
        "ZeRO-3 with its weights in host memory (`privzo bench offload`, one process, batch 16; "
        "the step's peaks, the planner's figures for the same plan)"
    )
    lines = _table_head(title, OFFLOAD_COLUMNS)
    for entry in entries:
        if "result" not in entry:
            lines.append(_status_row(entry, OFFLOAD_COLUMNS))
            continue
        lines.append(f"| {entry['case']} | " + " | ".join(_offload_cells(entry["result"])) + " |")
    return lines


def _offload_cells(result: dict[str, Any]) -> list[str]:
    seconds, ratios, plan = result["seconds"], result["ratios"], result["plan"]
    mib = 2**20
    device = result["device_peak_mb"]  # None on CPU, where the device is the host
    gpu_peak = None if device is None else max(device["dpzero"], device["mezo"])
    host_peak = max(result["host_peak_mb"][name] for name in ("dpzero", "mezo"))
    return [
        f"{seconds['forward']:.3f}",
        f"{seconds['dpzero']:.3f}",
        f"{seconds['mezo']:.3f}",
        f"{ratios['dpzero_step_over_two_forwards']:.2f}",
        "-" if gpu_peak is None else f"{gpu_peak:,.0f}",
        f"{plan['bytes_per_gpu'] / mib:,.0f}",
        _ratio(ratios["device_peak_over_planner"]),
        f"{host_peak:,.0f}",
        f"{plan['host_bytes'] / mib:,.0f}",
        _ratio(ratios["host_peak_over_planner"]),
        f"{plan['offload_bytes_per_step'] / 2**30:.2f}",
        _ratio(ratios["moved_gb_per_s"]),
    ]


def _table_head(title: str, columns: Sequence[str]) -> list[str]:
    """A Markdown section heading and the header of its table."""
    return ["## " + title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _status_row(entry: dict[str, Any], columns: Sequence[str]) -> str:
    """The row of a case with no result: its name, why, and the other cells empty."""
    return f"| {entry['case']} | {entry['status']} |" + " |" * (len(columns) - 2)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
