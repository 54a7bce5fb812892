"""Every option of every ``stream-anon`` command (the worker's parser included) has help text."""
from __future__ import annotations

import argparse

from stream_anon import cli
from stream_anon.kafka import app


def _parsers(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _undocumented():
    out = []
    for name, parser in [*_parsers(cli.build_parser(), "stream-anon"), ("stream-anon worker", app.build_parser())]:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                out.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_cli_option_has_help_text():
    assert _undocumented() == []


def test_the_check_sees_the_worker_and_the_subcommands():
    names = {name for name, _ in _parsers(cli.build_parser(), "stream-anon")}
    assert {"stream-anon replay", "stream-anon topics apply", "stream-anon calibrate", "stream-anon evaluate"} <= names
    parser = app.build_parser()
    parser.add_argument("--undocumented-option")
    undocumented = [f"--{a.dest}" for a in parser._actions if not a.help and a.option_strings]
    assert undocumented == ["--undocumented_option"]
