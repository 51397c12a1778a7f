"""``privzo --help`` is complete: every command says what it does and shows an example that
parses, every option has help, and choices, defaults and exit codes are on the page."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

import pytest

from privzo.cli import build_parser

Command = tuple[tuple[str, ...], argparse.ArgumentParser, str | None]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    """(words, parser, one-line summary) of every command and subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, command in action.choices.items():
                yield (*path, name), command, summaries.get(name)
                yield from commands(command, (*path, name))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user gives (not --help, --version or the subcommand's slot)."""
    builtin = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [action for action in parser._actions if not isinstance(action, builtin)]


ALL = list(commands(build_parser()))
NAMES = [" ".join(words) for words, _, _ in ALL]


def test_every_command_is_walked():
    assert {"run", "check", "privacy calibrate", "bench kernels", "models init"} <= set(NAMES)
    assert len(ALL) >= 20


@pytest.mark.parametrize(("words", "parser", "summary"), ALL, ids=NAMES)
def test_every_command_has_a_summary_a_description_and_an_example(words, parser, summary):
    assert summary and summary.strip(), f"privzo {' '.join(words)}: no one-line help"
    assert parser.description and parser.description.strip()
    assert parser.epilog and "example" in parser.epilog
    assert f"privzo {' '.join(words)}" in parser.epilog


@pytest.mark.parametrize(("words", "parser", "summary"), ALL, ids=NAMES)
def test_every_option_has_help_and_shows_its_choices_and_default(words, parser, summary):
    formatter = parser._get_formatter()
    text = parser.format_help()
    for action in options(parser):
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"privzo {' '.join(words)} {name}: no help"
        if action.choices:
            assert "{" + ",".join(map(str, action.choices)) + "}" in text, name
        if action.default is not None and action.default is not False:
            assert "default" in (formatter._get_help_string(action) or ""), name


@pytest.mark.parametrize(("words", "parser", "summary"), ALL, ids=NAMES)
def test_every_example_parses(words, parser, summary):
    top = build_parser()
    lines = [line.strip() for line in parser.epilog.splitlines() if "privzo " in line]
    for line in lines:
        argv = shlex.split(line[line.index("privzo ") :])[1:]
        args, extra = top.parse_known_args(argv)
        assert callable(args.handler), line
        assert all("=" in item for item in extra), line  # overrides after the options


def test_top_level_help_lists_the_exit_codes():
    text = build_parser().format_help()
    assert "exit codes:" in text
    for code in ("0", "1", "2", "3", "4", "130", "143"):
        assert f"\n  {code} " in text, code
