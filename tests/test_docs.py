"""The README and docs/ stay true: their links resolve, and every
`keras-transformer` command line they show names a command and flags that
the CLI has."""

import re

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"


def _anchors(page):
    """GitHub's anchors of the page's headings: lowercased, punctuation
    other than hyphens and underscores dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_to_a_heading_find_it(page):
    text = page.read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        linked = page.parent / target if target else page
        assert anchor in _anchors(linked), f"{page.name} links to a missing heading {target}#{anchor}"


def _command_lines(text):
    """The `keras-transformer ...` commands in the page's code blocks, with
    continuation lines joined and comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("keras-transformer "):
                yield line


def test_the_pages_show_real_commands_and_flags():
    import argparse

    from keras_transformer import cli

    parsers = {}
    original = argparse.ArgumentParser.parse_args

    def capture(parser, argv=None, namespace=None):
        parsers["root"] = parser
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            cli.main(["demo"])
    finally:
        argparse.ArgumentParser.parse_args = original
    commands = next(a for a in parsers["root"]._actions if isinstance(a, argparse._SubParsersAction))
    seen = 0
    for page in PAGES:
        for line in _command_lines(page.read_text(encoding="utf-8")):
            words = line.split()
            assert words[1] in commands.choices, f"{page.name}: unknown command in {line!r}"
            known = set(commands.choices[words[1]]._option_string_actions)
            for flag in (w for w in words[2:] if w.startswith("--")):
                assert flag in known, f"{page.name}: {words[1]} has no {flag} ({line!r})"
            seen += 1
    assert seen >= 10


def test_the_preset_table_is_the_presets():
    """docs/training.md's table of presets, which `train --help` points to,
    lists `keras_transformer.models.presets.PRESETS` row for row."""
    from keras_transformer.models.presets import PRESETS

    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    header = "| preset | num_layers | d_model | num_heads | dff | dropout_rate |"
    assert header in text
    fields = header.strip("| ").split(" | ")[1:]
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      text[text.index(header):], re.M)
    table = {name: {f: float(v) for f, v in zip(fields, values)} for name, *values in rows}
    assert table == {name: {f: float(sizes[f]) for f in fields} for name, sizes in PRESETS.items()}
