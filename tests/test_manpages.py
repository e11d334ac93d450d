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


def _examples(text: str) -> list[str]:
    """The EXAMPLES lines of a page, groff escapes undone."""
    block = text.split("\n.SH EXAMPLES\n.nf\n", 1)[1].split("\n.fi\n", 1)[0]
    return [line.removeprefix("\\&").replace("\\-", "-").replace("\\e", "\\") for line in block.splitlines()]


def test_every_command_has_examples():
    for name, cmd in cli.commands.items():
        assert not cmd.hidden and "Examples:" in (cmd.help or ""), name


EXAMPLES = [(page.name, line) for page in sorted(MAN.glob("*.1")) for line in _examples(page.read_text("utf-8"))]


@pytest.mark.parametrize("page,line", EXAMPLES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(EXAMPLES)])
def test_man_page_examples_work_on_the_bundled_stores(page, line, tmp_path):
    """Each EXAMPLES line, run by the shell from the source checkout (/tmp/ becomes a test directory),
    exits with the status its trailing '# exit N ...' documents (0 without one)."""
    import os
    import re
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "rmqtool"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rmqtool "$@"\n')
    wrapper.chmod(0o755)
    work = tmp_path / "tmp"
    work.mkdir()
    expected = int(m.group(1)) if (m := re.search(r"#\s*exit (\d+)\b", line)) else 0
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "fixtures").rglob("*")}
    proc = subprocess.run(["bash", "-c", line.replace("/tmp/", f"{work}/")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == expected, (page, line, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "fixtures").rglob("*")} == before   # fixtures untouched


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
