"""The commands, options and config keys the README and docs/ name exist in the code.

Code in the pages (fenced blocks and `inline code`) is scanned for ``privzo COMMAND ...`` with
its ``--options``, for standalone ``--options``, and for dotted keys of the run and search
configs (``optimizer.steps``, ``trials.count``); each must be in the parser that ``privzo`` runs
or in the pydantic config models, walked as docs/_reference.py walks them for the generated
reference. A renamed or removed command, option or key fails here until the docs follow.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from conftest import REPO

GENERATED = {"reference/cli.md", "reference/config.md"}  # written from the code by the build
FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1", re.MULTILINE | re.DOTALL)
SHELL = {"", "bash", "sh", "shell", "console"}  # fences whose lines are commands
PYTHON = {"python", "py"}  # fences of Python code: attribute names, not config keys
# the repository's other scripts, whose options the docs may name too
SCRIPTS = ("jobs/*.py", "tools/*.sh", "tools/*.py")
INLINE = re.compile(r"`([^`\n]+)`")
# run-config sections and the search config's sections; a key must not follow a dot or word
# character (module paths such as privzo.privacy.discrete) and file names are skipped
SECTION_KEY = re.compile(
    r"(?<![\w./-])((?:model|task|optimizer|privacy|parallel|tracking|trials|selection|scheduler|"
    r"budget|resources)(?:\.[a-z_]+)+)\b"
)
FILE_SUFFIXES = {"json", "yaml", "parquet", "png", "md", "db", "py", "csv", "jsonl", "lock"}
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _commands() -> dict[tuple[str, ...], set[str]]:
    """Every command path (words after ``privzo``) and the options it accepts."""
    reference = _reference_module()
    return {
        path: reference.option_strings(parser)
        for path, parser in reference.walk_commands(reference.parser())
    }


@cache
def _script_options() -> set[str]:
    """Options the repository's own scripts (jobs/, tools/) define or pass."""
    found: set[str] = set()
    for pattern in SCRIPTS:
        for script in REPO.glob(pattern):
            found.update(OPTION.findall(script.read_text(encoding="utf-8")))
    return found


@cache
def _config_keys() -> set[str]:
    reference = _reference_module()
    keys: set[str] = set()
    for _, _, model, _ in reference.config_models():
        keys.update(key for key, _, _ in reference.walk_fields(model))
    return keys


def doc_pages() -> list[Path]:
    pages = [REPO / "README.md"]
    for page in sorted((REPO / "docs").rglob("*.md")):
        relative = page.relative_to(REPO / "docs").as_posix()
        if relative not in GENERATED and not relative.startswith("_build/"):
            pages.append(page)
    return pages


def code_of(text: str) -> list[tuple[str, bool]]:
    """The code in a Markdown page, line by line, each with whether it may hold commands: fenced
    blocks but Python (continuation lines joined; shell blocks hold commands) and inline spans."""
    pieces = []
    for match in FENCE.finditer(text):
        if match.group(2).strip().lower() in PYTHON:
            continue
        shell = match.group(2).strip().lower() in SHELL
        lines = match.group(3).replace("\\\n", " ").splitlines()
        pieces.extend((line, shell) for line in lines)
    outside = FENCE.sub("", text)
    pieces.extend((span, True) for span in INLINE.findall(outside))
    return pieces


def privzo_invocations(line: str) -> list[list[str]]:
    """The words of each ``privzo ...`` command in a line of code, up to a shell separator."""
    found = []
    for match in re.finditer(r"(?:^|(?<=[\s(]))privzo\s+([a-z].*)", line):
        rest = re.split(r"\s(?:&&|\|\||;|\||#)\s?", match.group(1))[0]
        try:
            words = shlex.split(rest, comments=False)
        except ValueError:
            words = rest.split()
        found.append(words)
    return found


def _resolve(words: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the longest command path the words start with, the words after it)."""
    commands = _commands()
    path: tuple[str, ...] = ()
    for index, word in enumerate(words):
        if (*path, word) in commands:
            path = (*path, word)
        else:
            return path, words[index:]
    return path, []


def problems_in(text: str) -> list[str]:
    """What the code in a page names that the parser or the config models lack."""
    problems = []
    commands = _commands()
    every_option = set().union(*commands.values())
    for line, shell in code_of(text):
        for words in privzo_invocations(line) if shell else []:
            path, rest = _resolve(words)
            children = [other for other in commands if other[:-1] == path and other != path]
            if not path or (children and rest and not rest[0].startswith("-")):
                problems.append(f"unknown command: privzo {' '.join(words[:2])}")
                continue
            for word in rest:
                option = word.split("=", 1)[0]
                if OPTION.fullmatch(option) and option not in commands[path]:
                    problems.append(f"privzo {' '.join(path)} has no option {option}")
        if (
            shell
            and "privzo" not in line.split()
            and re.fullmatch(r"--[a-z][a-z0-9-]*(\s+\S+)?", line)
        ):
            option = line.split()[0]
            if option not in every_option | _script_options():
                problems.append(f"no command has the option {option}")
        for key in SECTION_KEY.findall(line):
            if key.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            if key not in _config_keys():
                problems.append(f"unknown config key: {key}")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_documented_commands_options_and_keys_exist(page):
    assert problems_in(page.read_text(encoding="utf-8")) == []


def test_the_scan_finds_what_the_docs_name():
    # the scan must see the README's commands and keys, or the test above would pass vacuously
    lines = [line for line, _ in code_of((REPO / "README.md").read_text(encoding="utf-8"))]
    named = {tuple(words[:1]) for line in lines for words in privzo_invocations(line)}
    assert {("run",), ("tune",), ("study",), ("demo",)} <= named
    assert "task.train_path" in {key for line in lines for key in SECTION_KEY.findall(line)}


def test_a_removed_command_option_or_key_is_caught():
    text = (
        "```bash\nprivzo run c.yaml --no-such-flag optimizer.no_such_key=1\nprivzo frobnicate\n"
        "privzo privacy epsilon --steps 4\n```\nUse `--also-missing` and `privacy.epsilon`.\n"
    )
    problems = "\n".join(problems_in(text))
    assert "privzo run has no option --no-such-flag" in problems
    assert "unknown config key: optimizer.no_such_key" in problems
    assert "unknown command: privzo frobnicate" in problems
    assert "no command has the option --also-missing" in problems
    assert "epsilon" not in problems and "--steps" not in problems
