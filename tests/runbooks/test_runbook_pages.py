"""Cheap checks that keep every runbook page honest (no broker, no JVM).

- every page has Symptoms, Confirm, Fix and Check it worked, and at least one drill block;
- the index links every page;
- every `streamberg ...` line in any shell block parses with the real argparse parser, so a
  renamed command or option fails here;
- every variable a block uses is documented (in the page's prose or the index).
"""

from __future__ import annotations

import shlex

import pytest

from streamberg.cli.main import build_parser
from tests.runbooks.drill import RUNBOOKS, SECTIONS, Page, pages

# A sample value per documented variable, of the type the options take.
SAMPLE_VALUES = {
    "CONFIG": "streamberg.yaml",
    "WHY": "RESET MASTER on db1",
    "TABLE": "raw.ev_a",
    "TOPIC": "ev.a_dead_letters",
    "PARTITION": "0",
    "FROM": "10",
    "TO": "20",
    "REASON": "missing required field 'user_id'%",
    "INGEST_PID": "12345",
    "WAREHOUSE": "/var/lib/streamberg/warehouse",
    "SINCE": "2026-11-25T10:00:00Z",
}
PAGES = pages()


def test_there_is_a_page_per_situation_of_the_issue() -> None:
    assert len(PAGES) == 16, [p.path.name for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path.name)
def test_page_has_the_four_parts_and_a_drill(page: Page) -> None:
    positions = [page.text.find(section + "\n") for section in SECTIONS]
    assert all(p >= 0 for p in positions), f"{page.path.name} lacks {[s for s, p in zip(SECTIONS, positions) if p < 0]}"
    assert positions == sorted(positions), f"{page.path.name}: sections out of order"
    drills = [b.drill for b in page.blocks if b.drill]
    assert drills and len(drills) == len(set(drills)), f"{page.path.name}: drill steps {drills}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path.name)
def test_index_links_the_page(page: Page) -> None:
    assert f"]({page.path.name})" in (RUNBOOKS / "README.md").read_text()


def _streamberg_lines(page: Page) -> list[str]:
    return [line for block in page.blocks if block.language in ("bash", "sh", "")
            for line in block.lines() if line.startswith("streamberg ")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path.name)
def test_every_streamberg_command_parses(page: Page) -> None:
    lines = _streamberg_lines(page)
    assert lines, f"{page.path.name} runs no streamberg command"
    parser = build_parser()
    for line in lines:
        words = shlex.split(line)
        args = [SAMPLE_VALUES.get(w[1:].strip("{}"), w) if w.startswith("$") else w for w in words[1:]]
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{page.path.name}: `{line}` does not parse with the real `streamberg` parser")
        if parsed.command == "replay":  # option combinations argparse cannot express
            from streamberg.cli.replay import validate

            try:
                validate(parsed)
            except SystemExit:
                pytest.fail(f"{page.path.name}: `{line}` is an invalid combination of replay options")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path.name)
def test_every_variable_is_documented(page: Page) -> None:
    index = (RUNBOOKS / "README.md").read_text()
    for block in page.blocks:
        for name in block.variables():
            assert f"`${name}`" in page.prose or f"`${name}`" in index, \
                f"{page.path.name}: ${name} is used but not documented"
            assert name in SAMPLE_VALUES, f"add a sample value for ${name} to this test"


def test_a_renamed_option_would_be_caught() -> None:
    """The parse check itself can fail: an option that does not exist is rejected."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split("status --config x --no-such-option"))
