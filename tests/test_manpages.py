"""The committed man pages must match what the click commands generate now."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rmqtool._manpages import render_pages, write_pages
from rmqtool.cli import cli
from tests.conftest import ROOT

MAN = ROOT / "man"


def test_man_pages_match_the_cli(tmp_path):
    write_pages(tmp_path)
    generated = {p.name: p.read_text("utf-8") for p in tmp_path.glob("*.1")}
    committed = {p.name: p.read_text("utf-8") for p in MAN.glob("*.1")}
    hint = "man pages drifted from the CLI: run `python -m rmqtool._manpages man/`"
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
