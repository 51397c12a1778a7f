"""What several commands share: the help layout, options with one meaning everywhere, and how a
config file and its overrides are read from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from privzo.config.run import RunConfig
    from privzo.distributed.cluster import RayTarget

DEFAULT_CACHE = Path("~/.cache/privzo").expanduser()
DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
DTYPES = "float32, bfloat16 or float16 (fp32, bf16, fp16 too)"

Commands = argparse._SubParsersAction  # what ``add_subparsers`` returns


class HelpFormatter(argparse.HelpFormatter):
    """Prose wrapped to the terminal, while blocks with indented lines (examples, exit codes)
    keep their lines; every option's default shown where its help does not state one."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        blocks = [
            indent + block.replace("\n", "\n" + indent)
            if any(line.startswith(" ") for line in block.splitlines())
            else fill(block, width, indent)
            for block in text.split("\n\n")
        ]
        return "\n\n".join(blocks)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == argparse.SUPPRESS:
            return text
        if "default" in text:  # stated in its own words
            return text
        return f"{text} (default: %(default)s)"


def add_command(
    commands: Commands,
    name: str,
    summary: str,
    examples: str | list[str],
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A command with its one-line summary (in its parent's list), a description (the summary
    where none is given) and its examples in the epilog."""
    lines = [examples] if isinstance(examples, str) else examples
    return commands.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        epilog="example" + ("s" if len(lines) > 1 else "") + ":\n  " + "\n  ".join(lines),
        formatter_class=HelpFormatter,
    )


def add_subcommands(parser: argparse.ArgumentParser, dest: str) -> Commands:
    return parser.add_subparsers(dest=dest, required=True, metavar="COMMAND")


def path_argument(text: str) -> Path:
    """A path option's type: an empty one is refused, since ``Path("")`` is the current
    directory and ``--output-dir ''`` (an unset shell variable) would write into it."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty path names no file or directory; give a path (. for the current directory)"
        )
    return Path(text)


def directory_argument(text: str) -> Path:
    """A directory option's type: ``path_argument``, and a path that exists must be a
    directory (a file there would fail later as "File exists")."""
    path = path_argument(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a file, not a directory; give a directory (a new one is created)"
        )
    return path


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=directory_argument,
        default=DEFAULT_CACHE,
        help="where built-in models are built and cached (default: ~/.cache/privzo)",
    )


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose", action="store_true", help="show the libraries' logs, warnings and bars too"
    )


def finish_command(
    parser: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace], int],
    *,
    quiet: str | None = None,
    cache_dir: bool = True,
    address: bool = False,
) -> None:
    """The options the working commands share, in one order (``--address`` where the command
    may run on a Ray cluster, ``--quiet`` with its own help where given, ``--cache-dir`` unless
    the command builds no model, ``--verbose``), then the handler the entry point calls."""
    if address:
        parser.add_argument("--address", help=ADDRESS_HELP)
    if quiet is not None:
        parser.add_argument("--quiet", action="store_true", help=quiet)
    if cache_dir:
        add_cache_dir(parser)
    add_verbose(parser)
    parser.set_defaults(handler=handler)


def add_json(parser: argparse.ArgumentParser, shape: str = "one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=f"print {shape}")


def add_output_dir(
    parser: argparse.ArgumentParser,
    what: str,
    *,
    overwrite: str | None = None,
    required: bool = True,
    default: Path | None = None,
) -> None:
    """``--output-dir`` (never empty, see ``directory_argument``) saying ``what`` it holds, and
    ``--overwrite`` with its help where a finished directory may be replaced."""
    parser.add_argument(
        "--output-dir", type=directory_argument, required=required, default=default, help=what
    )
    if overwrite is not None:
        parser.add_argument("--overwrite", action="store_true", help=overwrite)


class WorkOptions(TypedDict):
    """What the options ``finish_command`` adds (with ``--quiet``) ask of a library call that
    loads models and records runs, and where its runs are tracked."""

    cache_dir: Path
    progress: bool
    tracking_uri: str | None


def work_options(args: argparse.Namespace) -> WorkOptions:
    """The shared options of a command finished with ``quiet``, for its library call."""
    return WorkOptions(
        cache_dir=args.cache_dir, progress=not args.quiet, tracking_uri=tracking_uri()
    )


MERGED_OVERRIDES = (
    "more config files to merge, then key.sub=value overrides (e.g. optimizer.steps=800)"
)


def add_config(
    parser: argparse.ArgumentParser, kind: str, example: str, overrides: str = MERGED_OVERRIDES
) -> None:
    """The config file and what follows it (more files to merge, then dotted overrides)."""
    parser.add_argument(
        "config", type=path_argument, help=f"a {kind} config (YAML), e.g. {example}"
    )
    parser.add_argument("overrides", nargs="*", help=overrides)


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """(extra config files, key=value overrides): files merge over the first config in order."""
    return [item for item in items if "=" not in item], [item for item in items if "=" in item]


def load_run_config(args: argparse.Namespace) -> RunConfig:
    """The run config of ``args.config`` and ``args.overrides``; read before torch and
    transformers are imported, so a typo is reported in a second, not half a minute."""
    from privzo.config.loading import load_config

    extra_files, overrides = split_overrides(args.overrides)
    return load_config([args.config, *extra_files], overrides)


def all_overrides(items: list[str]) -> bool:
    """Whether the words argparse left over are overrides that followed the options."""
    return all("=" in item and not item.startswith("-") for item in items)


@contextmanager
def options_named(options: Mapping[str, str]) -> Iterator[None]:
    """A library's refusal of a value, naming the option the user wrote rather than the
    argument it set (``gpus must be >= 1`` → ``--gpus must be >= 1``, ``delta=0 ...`` →
    ``--delta 0 ...``)."""
    try:
        yield
    except ValueError as error:
        text = str(error)
        for name, option in options.items():
            if text.startswith(f"{name}="):
                raise ValueError(f"{option} {text.removeprefix(f'{name}=')}") from None
            if text.startswith(f"{name} "):
                raise ValueError(f"{option}{text.removeprefix(name)}") from None
        raise


def unrecognized(extra: list[str], takes_overrides: bool) -> str:
    """argparse's error for words it left over: where the command takes overrides, only the
    words that are not one, and how an override is written."""
    if not takes_overrides:
        return f"unrecognized arguments: {' '.join(extra)}"
    bad = [item for item in extra if not all_overrides([item])]
    return (
        f"unrecognized arguments: {' '.join(bad)}; an override is written key.sub=value "
        "(e.g. optimizer.steps=100)"
    )


def dtype_name(dtype: str) -> str:
    return DTYPE_ALIASES.get(dtype, dtype)


# Ray sets it for the driver of a `ray job submit` job, which runs in a temporary copy of the
# submitted working dir: a relative path there lands in Ray's session folder and is deleted.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def check_job_output_dir(output_dir: Path | None) -> None:
    """Refuse a relative ``--output-dir`` inside a Ray job: it would resolve into the job's
    temporary copy of the working dir, not the submitter's, and vanish with the job."""
    if output_dir is None or output_dir.expanduser().is_absolute():
        return
    if RAY_JOB_ENV not in os.environ:
        return
    raise ValueError(
        f"--output-dir {str(output_dir)!r} is relative, and this command runs inside a Ray job, "
        f"whose working directory ({Path.cwd()}) is a temporary copy that Ray deletes: give an "
        "absolute path on storage the cluster keeps, e.g. /shared/runs/NAME"
    )


def tracking_uri() -> str | None:
    """``MLFLOW_TRACKING_URI``: the MLflow server for runs whose config sets no ``tracking.uri``
    (a config's own server wins, as the run pipeline applies it)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None


ADDRESS_HELP = (
    "the Ray cluster to join (host:port, or 'local' for a new local Ray); default: "
    "RAY_ADDRESS, else the head of the latest `ray start --head` on this machine, else a new "
    "local Ray"
)


def ray_target(address: str | None) -> RayTarget:
    """Which Ray to use, from ``--address``, ``RAY_ADDRESS`` and the file where ``ray start``
    writes its address (under ``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else /tmp: Ray's own
    temp root)."""
    from privzo.distributed.cluster import RayTarget, address_file_under

    temp_root = os.environ.get("RAY_TMPDIR") or "/tmp"
    if "RAY_TMPDIR" not in os.environ and sys.platform.startswith("linux"):
        temp_root = os.environ.get("TMPDIR") or temp_root
    return RayTarget(
        address=address,
        env_address=os.environ.get("RAY_ADDRESS") or None,
        address_file=address_file_under(temp_root),
    )
