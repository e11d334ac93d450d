"""Docs as tests: every output the README shows is what the tool prints now.

The convention (README.md, "Output blocks"): a fenced ```` ```console ```` block holds shell sessions,
``$ COMMAND`` lines followed by exactly what they print (stdout and stderr as the terminal shows them). The
test finds every such block by itself and runs each command with bash in a fresh directory where
``fixtures/`` is the bundled fixtures (read-only) and ``rmqtool`` is this checkout. An HTML comment
``<!-- setup: SHELL -->`` on the line before a block runs first in that directory (to make a writable copy).
Blocks that only show commands use ```` ```sh ````; they are not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FENCE = re.compile(r"^(?:<!-- setup: (?P<setup>[^\n]*?) -->\n)?```console\n(?P<body>.*?)^```\n", re.S | re.M)
# What differs between runs and is not the tool's output: names of undo directories carry the wall clock.
VARIABLE = [(re.compile(r"\.undo-\d{8}-\d{6}-\d{6}"), ".undo-<time>")]


def console_blocks(text: str) -> list[tuple[int, str | None, list[tuple[str, str]]]]:
    """(line number, setup, [(command, expected output)]) of every console block of a Markdown text."""
    blocks = []
    for m in FENCE.finditer(text):
        sessions: list[list] = []
        for line in m.group("body").splitlines(keepends=True):
            if line.startswith("$ "):
                sessions.append([line[2:].rstrip("\n"), ""])
            else:
                assert sessions, f"README line {text.count(chr(10), 0, m.start()) + 1}: output before any '$ '"
                sessions[-1][1] += line
        blocks.append((text.count("\n", 0, m.start("body")) + 1, m.group("setup"), [tuple(s) for s in sessions]))
    return blocks


def normalise(text: str, work: str) -> str:
    if work:
        text = text.replace(work + "/", "")
    for pattern, repl in VARIABLE:
        text = pattern.sub(repl, text)
    return text


def shell(tmp_path):
    """A runner of shell lines in a fresh directory with fixtures/ and this checkout's rmqtool."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rmqtool").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rmqtool "$@"\n')
    (bin_dir / "rmqtool").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "fixtures").symlink_to(ROOT / "fixtures")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "TZ": "UTC"}

    def sh(line: str) -> str:
        proc = subprocess.run(["bash", "-c", line], cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        return normalise(proc.stdout, str(work))
    return sh


README_BLOCKS = console_blocks((ROOT / "README.md").read_text("utf-8"))


def test_the_readme_shows_output_blocks():
    assert len(README_BLOCKS) >= 25 and sum(len(s) for _, _, s in README_BLOCKS) >= 35


@pytest.mark.parametrize("line,setup,sessions", README_BLOCKS, ids=[f"README:{b[0]}" for b in README_BLOCKS])
def test_readme_output_block(line, setup, sessions, tmp_path):
    sh = shell(tmp_path)
    if setup:
        sh(setup)
    for command, expected in sessions:
        assert sh(command) == normalise(expected, ""), f"README.md line {line}: $ {command}"


def update(path=ROOT / "README.md") -> None:
    """Rewrite every console block of the README with what the commands print now (review the diff!):
    ``python -m tests.test_docs``."""
    import tempfile
    from pathlib import Path

    text = path.read_text("utf-8")

    def redo(m: re.Match) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            sh = shell(Path(tmp))
            if m.group("setup"):
                sh(m.group("setup"))
            (_, _, sessions), = console_blocks(m.group(0))
            body = "".join(f"$ {command}\n{sh(command)}" for command, _ in sessions)
        return m.group(0).replace(m.group("body"), body, 1)

    path.write_text(FENCE.sub(redo, text), "utf-8")


if __name__ == "__main__":
    update()


FIELD_ROW = re.compile(r"^\| `rmqtool ([^`]+)` \| ([a-z_0-9, ]+) \|$", re.M)
FIELD_ROWS = FIELD_ROW.findall((ROOT / "README.md").read_text("utf-8").split("### Output fields", 1)[1])


def test_the_readme_lists_the_output_fields_of_every_row_printing_command():
    from rmqtool.cli import cli

    listed = {args.split()[0] for args, _ in FIELD_ROWS}
    printing = {n for n, c in cli.commands.items() if any(p.name == "tablefmt" for p in c.params)}
    assert printing - listed <= {"info", "grep", "query-key", "query-id", "put", "import", "init", "repair", "restore",
                                 "rebuild-cq", "rebuild-index"}        # record fields (cat-commitlog), plans, info
    assert len(FIELD_ROWS) >= 25


@pytest.mark.parametrize("args,fields", FIELD_ROWS, ids=[a for a, _ in FIELD_ROWS])
def test_readme_output_fields(args, fields, tmp_path):
    from tests.conftest import run

    result = run(*(a.replace("fixtures/", f"{ROOT}/fixtures/", 1) for a in args.split()), "-f", "jsonl")
    assert list(json.loads(result.stdout.splitlines()[0])) == fields.split(", ")
