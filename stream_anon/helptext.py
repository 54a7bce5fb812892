"""Help text that states every default: argparse's ArgumentDefaultsHelpFormatter, without repeating a default the
help already names, and without the ``(default: None)`` / ``(default: False)`` of unset options and flags (their
help says what happens without them)."""
from __future__ import annotations

import argparse


def unset(default) -> bool:
    """No value by default (0 and 0.0 are values: ``0.0 in (False,)`` would say otherwise)."""
    return default is None or default is False or default is argparse.SUPPRESS or default == [] or default == ()


class DefaultsHelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or not action.option_strings or unset(action.default):
            return text
        return text + " (default: %(default)s)"


def with_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and every subcommand's parser under it with :class:`DefaultsHelpFormatter`."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                with_defaults(sub)
    return parser
