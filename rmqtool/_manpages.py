"""Man pages generated from the click commands: ``python -m rmqtool._manpages man/``.

One page per registered command (``rmqtool.1``, ``rmqtool-<command>.1``) with NAME, SYNOPSIS,
DESCRIPTION, OPTIONS, OUTPUT FIELDS, ENVIRONMENT, EXIT STATUS, FILES, EXAMPLES and SEE ALSO. A command's
examples are the ``Examples:`` block of its help text: command lines on a store named by a placeholder
(``STORE``, ``CRASHED_STORE``, ...: PLACEHOLDERS), or on a store ``rmqtool generate`` writes (a trailing
``# exit N`` gives a status other than 0). Generating the pages runs each example (``run_example``) with
each placeholder a copy of a bundled fixture store, and shows what it prints under it; tests/test_docs.py
runs them again and compares. The output fields are the README's "Output fields" table, which a test checks against what
the commands print. The pages are deterministic (no date, variable parts normalised), so a test can
regenerate them from the committed outputs and compare.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from rmqtool import __version__
from rmqtool.cli import cli
from rmqtool.cli.exitcodes import EXIT_STATUS_HELP

PROG = "rmqtool"
CHECKOUT = Path(__file__).resolve().parent.parent     # the source checkout: fixtures/, README.md
FILES = [
    ("STORE/commitlog/", "commit-log files, named by the 20-digit physical offset they start at"),
    ("STORE/consumequeue/TOPIC/QUEUE_ID/", "consume-queue files of 20-byte units"),
    ("STORE/index/", "index files, named by their creation time (yyyyMMddHHmmssSSS)"),
    ("STORE/checkpoint", "physic/logics/index message timestamps (and 5.x offsets)"),
    ("STORE/abort", "present while a broker runs or after it crashed"),
    ("STORE/lock", "locked by a running broker"),
    ("STORE/config/", "topics, consumer offsets, delay offsets (fastjson)"),
]
# The stores the examples name, and the bundled fixture (fixtures/NAME/store) each stands for when they run.
PLACEHOLDERS = {
    "STORE": "dev-sample",                       # a 4.9.7 broker's store
    "STORE_5X": "dev-sample-5x",                 # a 5.3.3 broker's store
    "CRASHED_STORE": "dev-sample-crash-torn",    # a broker killed mid-write: abort file, torn tail
    "BATCHCQ_STORE": "dev-batchcq-5x",           # batch consume queues
    "COMPACTION_STORE": "dev-compaction-5x",     # a compaction topic
    "CONFIG_STORE": "dev-config-5x",             # topics, groups, offsets in config/
    "DLEDGER_STORE": "dev-dledger",              # a DLedger commit log
    "LMQ_STORE": "dev-lmq-5x",                   # light message queues
    "ROCKSDB_STORE": "dev-rocksdbcq-5x",         # a RocksDB consume queue
    "TIMER_STORE": "dev-timer-5x",               # the 5.x timer store
    "TRACE_STORE": "dev-trace-5x",               # message traces (RMQ_SYS_TRACE_TOPIC)
}
_PLACEHOLDER = re.compile(r"\b(" + "|".join(sorted(PLACEHOLDERS, key=len, reverse=True)) + r")\b")


# What differs between runs of an example and is not the tool's output: the wall clock in names of backups
# and undo directories, the speed and time of an export, the shell's process id in /tmp/NAME-$$ paths, the pid, time
# and counter of a UNIQ_KEY put made (its class-loader hash is String.hashCode("rmqtool"): 4EF5682E).
VARIABLE = [(re.compile(r"(rmqtool-backup|\.undo)-\d{8}-\d{6}-\d{6}"), r"\1-<time>"),
            (re.compile(r" in \d+\.\d\d s, \d+ MB/s "), " in <seconds> s, <rate> MB/s "),
            (re.compile(r"\) in \d+\.\d\d s(?=$| \()", re.M), ") in <seconds> s"),
            (re.compile(r"\b((?:[0-9A-F]{24})?[0-9A-F]{8})[0-9A-F]{4}4EF5682E[0-9A-F]{12}\b"),
             r"\1<pid>4EF5682E<time>")]
FIELD_ROW = re.compile(r"^\| `rmqtool ([^`]+)` \| ([a-z_0-9, ]+) \|$", re.M)


def normalise(text: str, pid: int | None = None) -> str:
    """An example's output with what is truly variable replaced (VARIABLE; the shell's pid as ``$$``)."""
    if pid is not None:
        text = re.sub(rf"(/tmp/[\w.-]*?-){pid}(?!\d)", r"\1$$", text)
    for pattern, repl in VARIABLE:
        text = pattern.sub(repl, text)
    return text


def expected_status(line: str) -> int:
    """The exit status an example documents with a trailing ``# exit N`` (0 without one)."""
    return int(m.group(1)) if (m := re.search(r"#\s*exit (\d+)\b", line)) else 0


def run_example(line: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit status, what it prints: stdout and stderr as a terminal shows them) of an example line, run
    by bash in a fresh directory holding a copy of the bundled store each placeholder it names stands for
    (PLACEHOLDERS), where ``/tmp/`` is a fresh directory and ``rmqtool`` this checkout's (in UTC; ``env``:
    more variables, None to unset one). Paths and variable parts are normalised (``normalise``)."""
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, work = Path(tmp, "bin"), Path(tmp, "work")
        (work / "tmp").mkdir(parents=True)
        bin_dir.mkdir()
        (bin_dir / PROG).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {PROG} "$@"\n')
        (bin_dir / PROG).chmod(0o755)
        for name in set(_PLACEHOLDER.findall(line)):
            shutil.copytree(CHECKOUT / "fixtures" / PLACEHOLDERS[name] / "store", work / name)
        env = {k: v for k, v in {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                 "PYTHONPATH": str(CHECKOUT), "TZ": "UTC", **(env or {})}.items() if v is not None}
        proc = subprocess.Popen(["bash", "-c", line.replace("/tmp/", f"{work}/tmp/")], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=300)
        return proc.returncode, normalise(out.replace(f"{work}/tmp/", "/tmp/").replace(f"{work}/", ""), proc.pid)


def output_fields(readme: Path = CHECKOUT / "README.md") -> list[tuple[str, list[str]]]:
    """(command line, fields) of the README's "Output fields" table (checked against the commands)."""
    text = readme.read_text("utf-8") if readme.exists() else ""
    return [(args, fields.split(", ")) for args, fields in FIELD_ROW.findall(text.split("### Output fields", 1)[-1])]


def esc(text: str) -> str:
    """Escape text for groff: backslashes, dashes, characters beyond ASCII, and a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"[^\x00-\x7f]", lambda m: f"\\[u{ord(m.group()):04X}]", text)
    return "\\&" + text if text[:1] in (".", "'") else text


UNESCAPE = re.compile(r"\\(?:(e)|(-)|(&)|\[u([0-9A-F]{4,6})\])")


def unesc(text: str) -> str:
    """What ``esc`` escaped."""
    return UNESCAPE.sub(lambda m: "\\" if m[1] else "-" if m[2] else "" if m[3] else chr(int(m[4], 16)), text)


def _paragraphs(help_text: str) -> tuple[list[tuple[bool, list[str]]], list[str]]:
    """(paragraphs as (verbatim, lines), example lines) of a click help text."""
    text = inspect.cleandoc(help_text or "").split("\f")[0]
    paragraphs, examples = [], []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        verbatim = bool(lines) and lines[0].strip() == "\b"
        if verbatim:
            lines = lines[1:]
        if lines and lines[0].strip() == "Examples:":      # a line ending in ' \\' goes on in the next
            for line in (line.strip() for line in lines[1:] if line.strip()):
                if examples and examples[-1].endswith(" \\"):
                    examples[-1] = examples[-1][:-1] + line
                else:
                    examples.append(line)
        elif lines:
            paragraphs.append((verbatim, lines))
    return paragraphs, examples


def _description(paragraphs) -> list[str]:
    out = []
    for verbatim, lines in paragraphs:
        out.append(".PP")
        if verbatim:
            out += [".nf"] + [esc(line) for line in lines] + [".fi"]
        else:
            out.append(esc(" ".join(line.strip() for line in lines)))
    return out


def _options(cmd: click.Command, ctx: click.Context) -> tuple[list[str], list[str]]:
    options, env = [], []
    for param in cmd.get_params(ctx):
        if not isinstance(param, click.Option):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        options += [".TP", f"\\fB{esc(names)}\\fR", esc(help_text or "")]
        if isinstance(param.envvar, str):
            env += [".TP", f"\\fB{param.envvar}\\fR", esc(f"Default for {max(param.opts, key=len)}.")]
    return options, env


def _sections(*pairs) -> list[str]:
    out = []
    for title, body in pairs:
        if body:
            out += [f".SH {title}"] + body
    return out


EXAMPLES_INTRO = ("STORE is a broker's store directory (its storePathRootDir); CRASHED_STORE, TIMER_STORE and the "
                  "like, a store with that trait. Below each command is what it prints in a pipe (standard output "
                  "and error) on the store of that kind bundled with the source (fixtures/), which the test suite "
                  "checks: " + ", ".join(f"{k} is {v}" for k, v in PLACEHOLDERS.items()) + ".")


def _examples(examples: list[str], outputs: dict[str, str]) -> list[str]:
    if not examples:
        return []
    out = [".PP", esc(EXAMPLES_INTRO)]
    for line in examples:
        out += [".PP", ".nf", f"\\fB$ {esc(line)}\\fR"]
        text = outputs.get(line, "")
        out += [esc(row) for row in (text[:-1] if text.endswith("\n") else text).split("\n") if text] + [".fi"]
    return out


def page_examples(page: str) -> list[tuple[str, str]]:
    """(command line, output) of every example of a page's text, groff escapes undone."""
    section = page.split("\n.SH EXAMPLES\n", 1)[-1].split("\n.SH ", 1)[0] if "\n.SH EXAMPLES\n" in page else ""
    found = []
    for block in section.split("\n.PP\n.nf\n")[1:]:
        command, *lines = block.split("\n.fi", 1)[0].split("\n")
        found.append((unesc(command.removeprefix("\\fB$ ").removesuffix("\\fR")),
                      "".join(unesc(line) + "\n" for line in lines)))
    return found


def _common_sections(examples: list[str], see_also: list[str],
                     outputs: dict[str, str]) -> list[tuple[str, list[str]]]:
    status = []
    for code, text in EXIT_STATUS_HELP.items():
        status += [".TP", f"\\fB{int(code)}\\fR", esc(text)]
    files = []
    for name, text in FILES:
        files += [".TP", f"\\fI{esc(name)}\\fR", esc(text)]
    return [("EXIT STATUS", status), ("FILES", files), ("EXAMPLES", _examples(examples, outputs)),
            ("SEE ALSO", [esc(", ".join(f"{page}(1)" for page in see_also))])]


def summary(cmd: click.Command) -> str:
    """The first sentence of a command's help, whole (click's short help cuts it with '...')."""
    first = " ".join(inspect.cleandoc(cmd.help or "").split("\n\n", 1)[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", first, maxsplit=1)[0]


def _head(title: str) -> list[str]:
    return ['.\\" Generated by "python -m rmqtool._manpages" from the click commands; do not edit.',
            f'.TH "{title.upper()}" 1 "" "{PROG} {__version__}" "{PROG} manual"']


FIELDS_INTRO = ("The fields each of these command lines prints, in order (the keys of -f jsonl, the headers of "
                "-f csv and tsv; --fields picks among them):")


def _fields(name: str, fields: list[tuple[str, list[str]]]) -> list[str]:
    out = []
    for args, names in fields:
        if args.split()[0] == name:
            out += [".TP", f"\\fB{PROG} {esc(args)}\\fR", esc(", ".join(names))]
    return [".PP", esc(FIELDS_INTRO)] + out if out else []


def command_page(name: str, cmd: click.Command, root: click.Context, outputs: dict[str, str] | None = None,
                 fields: list[tuple[str, list[str]]] = ()) -> str:
    ctx = click.Context(cmd, info_name=name, parent=root)
    paragraphs, examples = _paragraphs(cmd.help)
    options, env = _options(cmd, ctx)
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    head = _head(f"{PROG}-{name}")
    body = _sections(
        ("NAME", [esc(f"{PROG}-{name} - {summary(cmd)}")]),
        ("SYNOPSIS", [f"\\fB{PROG} {esc(name)}\\fR {esc(usage)}"]),
        ("DESCRIPTION", _description(paragraphs)),
        ("OPTIONS", options),
        ("OUTPUT FIELDS", _fields(name, fields)),
        ("ENVIRONMENT", env),
        *_common_sections(examples, [PROG], outputs or {}),
    )
    return "\n".join(head + body) + "\n"


def main_page(group: click.Group, root: click.Context, names: list[str], outputs: dict[str, str] | None = None) -> str:
    paragraphs, examples = _paragraphs(group.help)
    options, env = _options(group, root)
    commands = []
    for name in names:
        commands += [".TP", f"\\fB{esc(name)}\\fR",
                     esc(summary(group.commands[name])) + f" See {PROG}-{esc(name)}(1)."]
    head = _head(PROG)
    body = _sections(
        ("NAME", [esc(f"{PROG} - {summary(group)}")]),
        ("SYNOPSIS", [f"\\fB{PROG}\\fR [OPTIONS] COMMAND [ARGS]..."]),
        ("DESCRIPTION", _description(paragraphs)),
        ("OPTIONS", options),
        ("COMMANDS", commands),
        ("ENVIRONMENT", env),
        *_common_sections(examples, [f"{PROG}-{n}" for n in names], outputs or {}),
    )
    return "\n".join(head + body) + "\n"


def example_lines(group: click.Group = cli) -> list[str]:
    """Every example command line of the pages, once."""
    lines = _paragraphs(group.help)[1]
    for cmd in group.commands.values():
        lines += _paragraphs(cmd.help)[1]
    return list(dict.fromkeys(lines))


def render_pages(group: click.Group = cli, outputs: dict[str, str] | None = None) -> dict[str, str]:
    """File name -> page text for the group and every visible command registered on it; ``outputs`` maps
    an example line to what it prints (``run_example``)."""
    root = click.Context(group, info_name=PROG, **group.context_settings)
    names = sorted(n for n, c in group.commands.items() if not c.hidden)
    fields = output_fields()
    pages = {f"{PROG}.1": main_page(group, root, names, outputs)}
    for name in names:
        pages[f"{PROG}-{name}.1"] = command_page(name, group.commands[name], root, outputs, fields)
    return pages


def committed_outputs(directory: Path) -> dict[str, str]:
    """Example line -> output, as the pages in ``directory`` show them."""
    return {line: out for page in sorted(directory.glob(f"{PROG}*.1"))
            for line, out in page_examples(page.read_text("utf-8"))}


def write_pages(directory: Path, outputs: dict[str, str] | None = None) -> list[Path]:
    """Write every page into ``directory`` and remove stale rmqtool pages there, with the examples'
    ``outputs``; an example without one is run for it."""
    directory.mkdir(parents=True, exist_ok=True)
    outputs = dict(outputs or {})
    for line in example_lines():
        if line not in outputs:
            outputs[line] = run_example(line)[1]
    pages = render_pages(outputs=outputs)
    for stale in directory.glob(f"{PROG}*.1"):
        if stale.name not in pages:
            stale.unlink()
    written = []
    for fname, text in pages.items():
        path = directory / fname
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    # python -m rmqtool._manpages [DIR] [--reuse]: --reuse keeps the outputs DIR's pages show and runs only
    # new examples (after a change of help text); without it every example runs again.
    args = [a for a in sys.argv[1:] if a != "--reuse"]
    target = Path(args[0] if args else "man")
    for page in write_pages(target, committed_outputs(target) if "--reuse" in sys.argv else None):
        print(page)
