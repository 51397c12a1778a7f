"""``privzo models init``: a local, randomly initialised model directory of a named shape (OPT,
Llama, Qwen2 or Mistral; ``privzo.models.shapes``).

It holds what a hub checkpoint holds (``save_pretrained`` weights and config, and a tokenizer),
so ``privzo run`` loads it with ``model.name_or_path=DIR`` like any checkpoint: a way to try
a real size's memory and speed with no download. The tokenizer is the byte-level BPE of privzo's
built-in models (trained on the public demo corpus), so any text encodes and the demo task runs
on it; reserved tokens fill its vocabulary up to the shape's, one token per embedding row.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from privzo.memory import available_memory_bytes
from privzo.models.architecture import count_parameters
from privzo.models.builtin import build_tokenizer
from privzo.models.shapes import random_model, resolve_shape, weight_bytes

_GIB = 2**30
# Shapes with more parameters than this print what they are doing (building and saving take
# seconds to minutes on CPU).
PROGRESS_PARAMETERS = 100_000_000


def init_model_directory(
    shape: str, output_dir: str | Path, *, dtype: str = "float32", seed: int = 0
) -> Path:
    """Write a seeded random model of ``shape`` in ``dtype`` and privzo's tokenizer to
    ``output_dir`` (new or empty); everything is checked before anything is built."""
    _, arch = resolve_shape(shape)
    target = Path(output_dir).expanduser()
    need = weight_bytes(arch, dtype)
    _check_target(target, need)
    _check_memory(shape, dtype, need)
    parameters = count_parameters(arch)
    say = _progress(parameters > PROGRESS_PARAMETERS)
    started = time.perf_counter()
    tokenizer = build_tokenizer(size=arch.vocab)
    tokenizer.model_max_length = arch.max_positions
    say(f"building {shape} ({parameters / 1e9:.3g}B parameters, {dtype}, {need / _GIB:.1f} GiB)")
    model = random_model(
        arch,
        dtype,
        seed=seed,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    say(f"built in {time.perf_counter() - started:.1f}s; saving to {target}")
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    record = {"shape": shape, "dtype": dtype, "seed": seed, "parameters": parameters}
    (target / "privzo_init.json").write_text(json.dumps(record, indent=2))
    say(f"done in {time.perf_counter() - started:.1f}s")
    return target


def _check_target(target: Path, need: int) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"--output-dir {target} exists and is not an empty directory")
    existing = next(parent for parent in (target, *target.parents) if parent.exists())
    free = shutil.disk_usage(existing).free
    if need > free:
        raise ValueError(
            f"--output-dir {target}: the weights need {need / _GIB:.1f} GiB of disk, "
            f"{free / _GIB:.1f} GiB are free there"
        )


def _check_memory(shape: str, dtype: str, need: int) -> None:
    free = available_memory_bytes()
    if free is not None and need > free:
        raise ValueError(
            f"shape {shape} in {dtype} needs {need / _GIB:.1f} GiB of memory to build; "
            f"{free / _GIB:.1f} GiB are available"
        )


def _progress(enabled: bool) -> Callable[[str], None]:
    def say(message: str) -> None:
        if enabled:
            print(f"[privzo] {message}", file=sys.stderr, flush=True)

    return say
