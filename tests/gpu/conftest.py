"""The GPU suite: every test here is marked ``gpu`` and skipped, with the reason, where no CUDA
device is visible or where Triton's interpreter is on (the suite checks the compiled kernels).

Run on its own, as ``tools/gpu-check.sh`` does: ``TRITON_INTERPRET=0 python -m pytest tests/gpu
-m gpu``. Where ``PRIVZO_GPU_RECORD`` names a file, each test appends its measured figures to it
as JSON lines, which the check's report reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent


def skip_reason() -> str | None:
    """Why the GPU suite cannot run in this process, or None where it can."""
    if not torch.cuda.is_available():
        return "no CUDA device visible: the GPU suite checks nothing here"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (
            "Triton's interpreter is on (TRITON_INTERPRET=1): the GPU suite checks the compiled "
            "kernels; run it on its own with TRITON_INTERPRET=0, as tools/gpu-check.sh does"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def gpu_record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``gpu_record(part, **figures)``: the figures, as one JSON line of ``PRIVZO_GPU_RECORD``."""

    def record(part: str, **figures: Any) -> None:
        path = os.environ.get("PRIVZO_GPU_RECORD")
        if not path:
            return
        line = {"part": part, "test": request.node.nodeid, **figures}
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")

    return record
