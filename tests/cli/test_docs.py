"""The documentation stays short where it must and points at what exists: README.md under 200 lines; every relative
link of README.md and docs/*.md to an existing file (and heading); every module, attribute and repository path the
documents name exists; every command of the README's table is a command of the CLI. Fast: no broker."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, *DOCS, ROOT / "topics" / "README.md"]      # the documents README.md sends a reader to

README_MAX_LINES = 200
# Documents linked before they are written, allowed to be missing until they land (none now).
PLANNED: set = set()
# Paths the documents name that a run writes (not in the repository), and logger names that look like modules.
WRITTEN_BY_A_RUN = {"reports/demo.json"}
LOGGERS = {"stream_anon.worker", "stream_anon.kafka.client"}

LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MODULE_RE = re.compile(r"\bstream_anon(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH_RE = re.compile(r"`((?:stream_anon|bench|tests|configs|topics|data|docs|reports)/[A-Za-z0-9_./-]*)`")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", _without_code_blocks(path.read_text()),
                                                   flags=re.M)}


def test_readme_fits_a_newcomers_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=_name)
def test_every_relative_link_points_to_an_existing_file_and_heading(doc):
    broken = []
    for target in LINK_RE.findall(_without_code_blocks(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if path in PLANNED and not path.exists():
            continue
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {_name(path)}")
    assert not broken, f"{_name(doc)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", LINKED, ids=_name)
def test_every_module_and_path_named_exists(doc):
    text = doc.read_text()
    missing = []
    for ref in sorted(set(MODULE_RE.findall(text)) - LOGGERS):
        parts = ref.split(".")
        for i in range(len(parts), 0, -1):        # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                missing.append(ref)
                break
            obj = getattr(obj, attr)
    for path in sorted(set(PATH_RE.findall(text)) - WRITTEN_BY_A_RUN):
        if not any(c in path for c in "<*") and not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{_name(doc)} names what does not exist: {missing}"


def test_the_readme_commands_are_commands_of_the_cli():
    from stream_anon.cli import build_parser
    text = README.read_text()
    section = text[text.index("\n## Commands\n"):]
    named = set(re.findall(r"^\| `stream-anon ([a-z]+)", section, flags=re.M))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert named and named <= set(sub.choices), named - set(sub.choices)
