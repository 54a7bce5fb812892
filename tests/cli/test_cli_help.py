"""Every option of every ``stream-anon`` command (the worker's parser included) has help text, and the help states
its default."""
from __future__ import annotations

import argparse

from stream_anon import cli
from stream_anon.helptext import unset
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


def _option_helps():
    """(command, option, its default, its line(s) in the command's --help)."""
    for name, parser in [*_parsers(cli.build_parser(), "stream-anon"), ("stream-anon worker", app.build_parser())]:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                yield name, action.option_strings[-1], action.default, formatter._expand_help(action) \
                    if action.help else ""


def test_every_option_with_a_default_states_it():
    """argparse's ArgumentDefaultsHelpFormatter rule (issue 43: --idle, --batch-within, --margin, --k said none):
    an option with a value by default names it in its help; an unset one (None) names what happens without it
    where the issue asked (--flush-when-idle, demo --k)."""
    missing = [f"{name} {opt}" for name, opt, default, text in _option_helps()
               if not unset(default) and "default" not in text.lower()]
    assert missing == []
    helps = {(name, opt): text for name, opt, _, text in _option_helps()}
    for key, default in {("stream-anon audit", "--idle"): "3.0", ("stream-anon report", "--idle"): "3.0",
                         ("stream-anon worker", "--batch-within"): "0.5",
                         ("stream-anon calibrate", "--margin"): "0.0", ("stream-anon evaluate", "--k"): "2,5,10",
                         ("stream-anon demo", "--k"): "its k",
                         ("stream-anon worker", "--flush-when-idle"): "never"}.items():
        assert f"default: {default}" in helps[key], (key, helps[key])
    assert "--idle IDLE" in cli.build_parser()._subparsers._group_actions[0].choices["audit"].format_help()
    text = cli.build_parser()._subparsers._group_actions[0].choices["audit"].format_help()
    assert "(default: 3.0)" in " ".join(text.split()) and "(default: warning) (default" not in text
