"""The committed man pages must match what the click commands generate now."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from rmqtool._manpages import committed_outputs, render_pages, write_pages
from rmqtool.cli import cli
from tests.conftest import ROOT

MAN = ROOT / "man"


def test_man_pages_match_the_cli(tmp_path):
    """Everything but the examples' outputs, which tests/test_docs.py runs and compares."""
    write_pages(tmp_path, committed_outputs(MAN))
    generated = {p.name: p.read_text("utf-8") for p in tmp_path.glob("*.1")}
    committed = {p.name: p.read_text("utf-8") for p in MAN.glob("*.1")}
    hint = "man pages drifted from the CLI: run `python -m rmqtool._manpages man/ --reuse`"
    assert sorted(committed) == sorted(generated), hint
    for name, text in generated.items():
        assert committed[name] == text, f"{name}: {hint}"


def test_every_command_has_a_page_with_the_required_sections():
    pages = render_pages()
    visible = [n for n, c in cli.commands.items() if not c.hidden]
    assert sorted(pages) == sorted(["rmqtool.1"] + [f"rmqtool-{n}.1" for n in visible])
    for name, text in pages.items():
        for section in ("NAME", "SYNOPSIS", "EXIT STATUS", "FILES", "EXAMPLES", "SEE ALSO"):
            assert f"\n.SH {section}\n" in text, (name, section)
    assert render_pages() == pages            # deterministic


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_pages_render_without_groff_warnings():
    for path in sorted(MAN.glob("*.1")):
        proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stderr == "", (path.name, proc.stderr)


def test_every_command_has_examples():
    for name, cmd in cli.commands.items():
        assert not cmd.hidden and "Examples:" in (cmd.help or ""), name


@pytest.mark.slow
def test_the_wheel_installs_the_man_pages(tmp_path):
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip().splitlines()[-1:]}")
    (wheel,) = tmp_path.glob("rmqtool-*.whl")
    names = {n.rsplit("/", 1)[-1] for n in zipfile.ZipFile(wheel).namelist() if "/data/share/man/man1/" in n}
    assert names == {p.name for p in MAN.glob("*.1")}


def test_name_lines_are_whole_sentences():
    for path in sorted(MAN.glob("*.1")):
        text = path.read_text("utf-8")
        name = text.split("\n.SH NAME\n", 1)[1].split("\n", 1)[0]
        assert name.endswith(".") and "..." not in name, (path.name, name)


def test_help_fits_80_columns_however_wide_the_terminal():
    from click.testing import CliRunner

    for name in [None, *cli.commands]:
        result = CliRunner().invoke(cli, [name, "--help"] if name else ["--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        wide = [line for line in result.output.splitlines() if len(line) > 80]
        assert wide == [], (name, wide)


def test_help_examples_run_after_a_plain_install():
    """Examples name stores by placeholders (STORE, CRASHED_STORE, ...), never a path of the source checkout;
    one writes its store with `rmqtool generate` first and uses it."""
    from rmqtool._manpages import PLACEHOLDERS, example_lines

    lines = example_lines()
    assert not [line for line in lines if "fixtures/" in line]
    assert sum("STORE" in line for line in lines) >= len(lines) // 2
    assert {name for line in lines for name in PLACEHOLDERS if f"{name}" in line} == set(PLACEHOLDERS)
    assert any(re.match(r"rmqtool generate (\S+) .*&& rmqtool \S+ \1", line) for line in lines)
