"""The docs stay true to the program: every flag the CLI accepts is on its command's page,
every example command line in the docs parses, every link resolves, and the README's
picture of `watch` is what the dashboard draws today from the recorded run.

Nothing here runs a command: the parser is built as `distdoctor` builds it (the `watch`
plugin included) and asked to parse, which checks flags and values, not paths."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from distdoctor.cli import build_parser
from distdoctor.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMANDS = DOCS / "commands"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()  # no argv: every command, plugins (watch) included


def subcommands(parser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def option_strings(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def mentions(text: str, flag: str) -> bool:
    """`flag` as a word of its own: `-b` is not found in `-b4` or `--bar`."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_command_has_a_page_that_names_every_flag(parser):
    missing = {}
    for name, sub in sorted(subcommands(parser).items()):
        page = COMMANDS / f"{name}.md"
        assert page.exists(), f"`distdoctor {name}` has no page: write {page.relative_to(ROOT)}"
        text = page.read_text()
        absent = sorted(f for f in option_strings(sub) if not mentions(text, f))
        if absent:
            missing[name] = absent
    assert not missing, f"flags missing from their docs/commands page: {missing}"
    index = (COMMANDS / "README.md").read_text()
    assert all(mentions(index, f) for f in option_strings(parser)), "top-level flags"
    assert all(f"{name}.md" in index for name in subcommands(parser)), "the commands index"


def test_the_flags_a_page_lists_are_flags_of_its_command(parser):
    """The first column of a page's flags table names real flags (none left behind by a
    rename)."""
    for name, sub in sorted(subcommands(parser).items()):
        known = option_strings(sub)
        table = (COMMANDS / f"{name}.md").read_text().split("## Flags", 1)[1].split("\n## ")[0]
        for row in table.splitlines():
            if not row.startswith("| `"):
                continue
            for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", row.split("|")[1]):
                assert flag in known, f"{name}.md lists {flag}, which `distdoctor {name}` lacks"


def example_lines(text: str) -> list[str]:
    """Command lines in ```console / ```bash blocks that run `distdoctor`: prompts
    (`$ `, `head$ `) and leading VAR=value assignments stripped, continuations joined."""
    out = []
    for block in re.findall(r"^```(?:console|bash)\n(.*?)^```", text, re.M | re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for line in lines:
            line = re.sub(r"^\S*\$ ", "", line.strip())
            line = re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", line)
            if line.startswith("distdoctor "):
                out.append(line)
    return out


def words_of(line: str) -> list[str]:
    """The command's own words: up to the first pipe, redirection, `;` or `&`."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = []
    for word in lex:
        if word and set(word) <= set("|&;<>()"):
            break
        words.append(word)
    return words


def test_every_example_in_the_docs_parses(parser):
    checked = 0
    for page in [README, *PAGES]:
        for line in example_lines(page.read_text()):
            try:
                parser.parse_args(words_of(line)[1:])
            except UserError as exc:
                pytest.fail(f"{page.relative_to(ROOT)}: `{line}` does not parse: {exc}")
            checked += 1
    assert checked >= 40, checked  # the docs are full of examples: the reader found them


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_links_in_the_readme_and_the_docs_resolve():
    for page in [README, *PAGES]:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"", text):
            target = target[0] or target[1]
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            assert where.exists(), f"{page.relative_to(ROOT)} links to missing {target}"
            if anchor and where.suffix == ".md":
                assert anchor in anchors(where), f"{page.relative_to(ROOT)}: no #{anchor} " \
                                                 f"in {where.relative_to(ROOT)}"


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move the details to docs/"


def test_the_screenshot_is_what_watch_draws_from_the_recorded_run():
    """Redrawn from docs/images/watch-mismatch.run.tar.gz; the text on screen must be the
    committed SVG's (styling may differ between Textual releases)."""
    spec = importlib.util.spec_from_file_location("make_screenshot", DOCS / "make_screenshot.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    assert shot.IMAGE.exists() and shot.ARCHIVE.exists()
    assert f"({shot.IMAGE.relative_to(ROOT)})" in README.read_text()
    committed = shot.screen_text(shot.IMAGE.read_text())
    assert any("MISMATCH" in line for line in committed), committed
    assert shot.screen_text(shot.draw_archive()) == committed, \
        "docs/images/watch-mismatch.svg is stale: run `python docs/make_screenshot.py`"
