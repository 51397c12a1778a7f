"""The trajectory: one row per step, enough to rebuild the fine-tuned weights from the base.

A run's released output is its base-model reference plus this table (a few kilobytes): every
row holds only public quantities (the step's direction seed and the noised projected gradients,
one per direction of the step).

Format 2 adds the columns of directions 2..K (``optimizer.directions_per_step``); format 1
(no ``format_version`` in the metadata, one direction per step) still reads and replays.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from privzo.config.run import RunConfig
from privzo.zo.directions import DIRECTIONS_VERSION, direction_seeds
from privzo.zo.integrity import check_rows, columns_checksum
from privzo.zo.perturbation import Perturber
from privzo.zo.step import StepRecord, update_coefficients

_FIRST_COLUMNS = [
    ("step", pa.int64()),
    ("seed", pa.int64()),
    ("projected_gradient", pa.float64()),  # of the step's first direction
    ("learning_rate", pa.float64()),
    ("batch_size", pa.int64()),
    ("direction_scale", pa.float64()),
]
# the released g and direction scale of directions 2..K (empty lists with one direction)
EXTRA_COLUMNS = ("extra_projected_gradients", "extra_direction_scales")
SCHEMA = pa.schema(_FIRST_COLUMNS + [(name, pa.list_(pa.float64())) for name in EXTRA_COLUMNS])
FORMAT_VERSION = 2
"""The trajectory's format: 2 added ``EXTRA_COLUMNS`` and ``TrajectoryMeta.directions``."""
_METADATA_KEY = b"privzo"
_CHECKSUM_KEY = b"privzo.checksum"  # of the rows (privzo.zo.integrity); absent before it existed
# of the metadata's bytes and the rows' checksum: replay reads the metadata too (the perturbation
# scale moves every weight); absent before it existed
_META_CHECKSUM_KEY = b"privzo.checksum.meta"
# HMAC of the metadata's checksum under the run's secret key (kept in its run directory, never
# released): an edit whose checksums were recomputed fails it; absent before it existed
_KEYED_CHECKSUM_KEY = b"privzo.checksum.keyed"


@dataclass(frozen=True)
class TrajectoryMeta:
    """What replay needs besides the rows: how directions were drawn and on what."""

    perturbation_scale: float
    direction: str
    device_type: str
    trainable: str  # the PEFT view
    view_options: dict[str, Any]  # its options (LoRA rank, targets, prefix length, ...)
    view_seed: int  # public seed of the adapters' initialisation
    model: str
    dtype: str
    perturbation: str  # "inplace" (fp32) or "virtual" (half precision)
    generator: str = "torch-blocks"  # of the directions (privzo.zo.directions.GENERATORS)
    directions_version: int = DIRECTIONS_VERSION
    # privzo.zo.integrity.weights_fingerprint of the base model (None: not taken, e.g. zero3)
    base_fingerprint: dict[str, list] | None = None
    # the hub commit of the base model (None: a built-in or local model); replay loads it
    model_revision: str | None = None
    directions: int = 1  # per step (optimizer.directions_per_step)
    format_version: int = FORMAT_VERSION  # a file without one is format 1


def format_columns(version: int) -> list[str]:
    """The columns of a trajectory of format ``version`` (its checksum covers exactly these)."""
    return SCHEMA.names if version >= 2 else [name for name, _type in _FIRST_COLUMNS]


def trajectory_meta(
    config: RunConfig,
    device_type: str,
    perturber: Perturber,
    base_fingerprint: dict[str, list] | None = None,
    model_revision: str | None = None,
) -> TrajectoryMeta:
    """A run's replay metadata: its config's view and directions, how its perturber actually
    moves the weights (``perturber.mode``, its generator) on ``device_type``, the base
    model's fingerprint and the hub commit it was loaded at."""
    return TrajectoryMeta(
        perturbation_scale=config.optimizer.perturbation_scale,
        direction=config.optimizer.direction,
        device_type=device_type,
        trainable=config.model.trainable,
        view_options=config.model.peft.model_dump(mode="json"),
        view_seed=config.seed,
        model=config.model.name_or_path,
        dtype=config.model.dtype,
        perturbation=perturber.mode,
        generator=perturber.sampler.generator,
        base_fingerprint=base_fingerprint,
        model_revision=model_revision,
        directions=config.optimizer.directions_per_step,
    )


class TrajectoryRecorder:
    """Collects step rows in memory (a few dozen bytes each) and writes them as Parquet."""

    def __init__(self, meta: TrajectoryMeta, release_batch_size: bool) -> None:
        """``release_batch_size=False`` for private runs: the realised Poisson batch size
        depends on who is in the data and is not covered by the accountant, so it is withheld
        (null); replay does not need it."""
        self.meta = meta
        self.release_batch_size = release_batch_size
        self._columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}

    def append(self, record: StepRecord) -> None:
        assert len(record.extra_projected_gradients) == self.meta.directions - 1
        for name in SCHEMA.names:
            value = getattr(record, name)
            self._columns[name].append(list(value) if name in EXTRA_COLUMNS else value)
        if not self.release_batch_size:
            self._columns["batch_size"][-1] = None

    def __len__(self) -> int:
        return len(self._columns["step"])

    def append_rows(self, table: pa.Table) -> None:
        """Put an earlier attempt's rows back (they were released already; resume)."""
        for row in iter_rows(table):
            for name in SCHEMA.names:
                self._columns[name].append(row[name])

    def to_table(self) -> pa.Table:
        table = pa.table(self._columns, schema=SCHEMA)
        # the rows are written in this format whatever meta was read from
        raw = json.dumps({**self.meta.__dict__, "format_version": FORMAT_VERSION}).encode()
        checksum = columns_checksum(self._columns).encode()
        meta = {
            _METADATA_KEY: raw,
            _CHECKSUM_KEY: checksum,
            _META_CHECKSUM_KEY: _meta_checksum(raw, checksum),
        }
        return table.replace_schema_metadata(meta)

    def to_bytes(self) -> bytes:
        """The trajectory as a parquet file's bytes (a run directory writes them atomically,
        ``privzo.rundir``; a Ray Train rank returns them to the driver)."""
        sink = io.BytesIO()
        pq.write_table(self.to_table(), sink)
        return sink.getvalue()

    def write(self, path: Path) -> None:
        pq.write_table(self.to_table(), Path(path))


def _meta_checksum(raw_meta: bytes, rows_checksum: bytes) -> bytes:
    return hashlib.sha256(raw_meta + b"\0" + rows_checksum).hexdigest().encode()


def _keyed_checksum(key: bytes, meta_checksum: bytes) -> bytes:
    return hmac.new(key, meta_checksum, hashlib.sha256).hexdigest().encode()


def with_keyed_checksum(data: bytes, key: bytes) -> bytes:
    """A trajectory file's bytes with a checksum keyed by ``key`` added to its metadata.

    The plain checksums can be recomputed by whoever edits the file; this one only by whoever
    holds the key, a random secret of the run kept in its directory (``privzo.rundir``). The key
    depends on no data, so the released checksum reveals nothing about the training set."""
    table = pq.read_table(io.BytesIO(data))
    stored = dict(table.schema.metadata or {})
    stored[_KEYED_CHECKSUM_KEY] = _keyed_checksum(key, stored[_META_CHECKSUM_KEY])
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(stored), sink)
    return sink.getvalue()


def read_trajectory(path: Path, key: bytes | None = None) -> tuple[pa.Table, TrajectoryMeta]:
    """The rows and metadata of a trajectory file of any format (format 1 gets the empty extra
    columns of its one direction per step), checked (``privzo.zo.integrity``). A file Parquet
    or the metadata's JSON cannot read is refused as damaged, with privzo's message.

    With the run's ``key`` (``with_keyed_checksum``), a file edited and its checksums
    recomputed is refused too; without it only damage and careless edits are."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"trajectory file {str(path)!r} does not exist")
    try:
        return _read_checked(Path(path), key)
    # Arrow raises OSError for a footer or page header it cannot deserialize
    except (
        pa.ArrowException,
        OSError,
        json.JSONDecodeError,
        UnicodeDecodeError,
        TypeError,
    ) as error:
        raise ValueError(
            f"trajectory {str(path)!r} cannot be read ({type(error).__name__}: "
            f"{str(error)[:200]}): a damaged file; replay needs the file the run wrote"
        ) from None


def _read_checked(path: Path, key: bytes | None) -> tuple[pa.Table, TrajectoryMeta]:
    table = pq.read_table(path)
    stored = table.schema.metadata or {}
    raw = stored.get(_METADATA_KEY)
    if raw is None:
        raise ValueError(f"{str(path)!r} is not a privzo trajectory (no privzo metadata)")
    meta = TrajectoryMeta(**{"format_version": 1, **json.loads(raw)})
    if meta.format_version > FORMAT_VERSION:
        raise ValueError(
            f"trajectory {str(path)!r} has format {meta.format_version}; this privzo reads up to "
            f"format {FORMAT_VERSION}: replay it with a newer privzo"
        )
    meta_checksum = stored.get(_META_CHECKSUM_KEY)
    rows_checksum = stored.get(_CHECKSUM_KEY, b"")
    if meta_checksum is not None and meta_checksum != _meta_checksum(raw, rows_checksum):
        raise ValueError(
            f"trajectory {str(path)!r} fails its checksum: its metadata changed after the run "
            "wrote it (a damaged or edited file); replay would build wrong weights"
        )
    if key is not None:
        _check_keyed(path, stored, key)
    names = format_columns(meta.format_version)
    missing = set(names) - set(table.column_names)
    if missing:
        raise ValueError(f"trajectory {str(path)!r} lacks columns {sorted(missing)}")
    columns = {name: table.column(name).to_pylist() for name in names}
    checksum = stored.get(_CHECKSUM_KEY)
    if checksum is None and meta.format_version >= 2:  # every format-2 writer wrote one
        raise ValueError(
            f"trajectory {str(path)!r} has no checksum, which every run writes: an edited "
            "file; replay would build weights nobody can vouch for"
        )
    if checksum is not None and checksum.decode() != columns_checksum(columns):
        raise ValueError(
            f"trajectory {str(path)!r} fails its checksum: its rows changed after the run wrote "
            "them (a damaged or edited file); replay would build wrong weights"
        )
    if meta.format_version < 2:
        table = _with_extra_columns(table.select(names))
    check_rows(
        {name: table.column(name).to_pylist() for name in SCHEMA.names},
        f"trajectory {str(path)!r}",
        directions=meta.directions,
    )
    return table, meta


def _check_keyed(path: Path, stored: dict[bytes, bytes], key: bytes) -> None:
    """Refuse a file whose keyed checksum is missing or is not the one ``key`` makes."""
    keyed = stored.get(_KEYED_CHECKSUM_KEY)
    meta_checksum = stored.get(_META_CHECKSUM_KEY)
    if keyed is None or meta_checksum is None:
        raise ValueError(
            f"trajectory {str(path)!r} has no keyed checksum, which its run directory's key "
            "says the run wrote: an edited file or another run's; replay would build weights "
            "nobody can vouch for"
        )
    if not hmac.compare_digest(keyed, _keyed_checksum(key, meta_checksum)):
        raise ValueError(
            f"trajectory {str(path)!r} fails the keyed checksum of its run directory's key: "
            "it was edited and its checksums recomputed, or it is another run's file; replay "
            "would build weights nobody can vouch for"
        )


def _with_extra_columns(table: pa.Table) -> pa.Table:
    """A format-1 table with the (empty) extra-direction columns of the current schema."""
    empty = pa.array([[] for _ in range(table.num_rows)], pa.list_(pa.float64()))
    for name in EXTRA_COLUMNS:
        table = table.append_column(name, empty)
    return table


def iter_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    columns = {name: table.column(name).to_pylist() for name in SCHEMA.names}
    for index in range(table.num_rows):
        yield {name: values[index] for name, values in columns.items()}


# Called during replay with (step row, direction index k, +1 or −1) while the weights sit at
# θ_t + r·z_k or θ_t − r·z_k: for each step, k = 0..K − 1 in order, +1 before −1.
PerturbedProbe = Callable[[dict[str, Any], int, int], None]


def replay_steps(
    perturber: Perturber,
    table: pa.Table,
    meta: TrajectoryMeta,
    at_perturbed: PerturbedProbe | None = None,
) -> int:
    """Apply every step with the training run's exact calls and coefficients; returns steps.

    Training evaluated at +r and −r (r = ε·s, s the direction scale) and then updated by −ηg·s,
    even on an empty batch. Making the same perturber calls in the same order performs the same
    float operations (for in-place fp32 weights: +r, −2r, then +(r − ηg·s)), so the weights come
    out bit-identical, which a single net update −ηg·s would not.

    A step with K directions replays as ``zo_step`` made it: ±r on each z_k (restoring θ
    between them), then the K updates −(η/K)·g_k·s_k, the last fused with its restore.

    A half-precision (virtual) run replayed into fp32 weights gets its intended model: each
    step's update θ ← θ − ηg·s·z in fp32, none of the training run's roundings.
    """
    if meta.directions_version != DIRECTIONS_VERSION:
        raise ValueError(
            f"trajectory uses directions version {meta.directions_version}; this privzo draws "
            f"version {DIRECTIONS_VERSION}, so replay would not reproduce the run; replay it with "
            "the privzo release that trained it"
        )
    if meta.generator != perturber.sampler.generator:
        raise ValueError(
            f"trajectory was drawn with the {meta.generator!r} generator but the replay samples "
            f"directions with {perturber.sampler.generator!r}"
        )
    intended = meta.perturbation == "virtual" and perturber.mode == "inplace"
    if meta.perturbation != perturber.mode and not intended:
        raise ValueError(
            f"trajectory was trained with {meta.perturbation} perturbation but the replay "
            f"model's weights use {perturber.mode}; load the base model in the training dtype"
        )
    steps = 0
    for row in iter_rows(table):
        seeds = direction_seeds(row["seed"], meta.directions)
        scales = [row["direction_scale"], *row["extra_direction_scales"]]
        gradients = [row["projected_gradient"], *row["extra_projected_gradients"]]
        if not intended:  # half precision into fp32 makes only the updates, unrounded
            _evaluation_moves(perturber, row, seeds, scales, meta, at_perturbed)
        perturber.update_all(seeds, update_coefficients(row["learning_rate"], gradients, scales))
        steps += 1
    return steps


def _evaluation_moves(
    perturber: Perturber,
    row: dict[str, Any],
    seeds: list[int],
    scales: list[float],
    meta: TrajectoryMeta,
    at_perturbed: PerturbedProbe | None,
) -> None:
    """The step's moves to θ ± r·z_k and back between directions, as ``zo_step`` makes them."""
    for index, (seed, scale) in enumerate(zip(seeds, scales, strict=True)):
        radius = meta.perturbation_scale * scale
        perturber.perturb(seed, radius)
        if at_perturbed is not None:
            at_perturbed(row, index, 1)
        perturber.perturb(seed, -radius)
        if at_perturbed is not None:
            at_perturbed(row, index, -1)
        if index < len(seeds) - 1:
            perturber.update(seed, 0.0)
