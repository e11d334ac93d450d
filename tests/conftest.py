"""Shared test helpers: the CLI runner, the bundled real-broker fixture stores and their ground truth."""

from __future__ import annotations

import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CLEAN_SETS = ["dev-sample", "dev-sample-5x"]
CRASH_SETS = ["dev-sample-crash", "dev-sample-crash-torn", "dev-sample-5x-crash", "dev-sample-5x-crash-torn"]
ALL_SETS = CLEAN_SETS + CRASH_SETS
# Second batch: 5.x features and DLedger (not in the lists above, which other tests walk as classic stores).
TIMER_SETS = ["dev-timer-5x"]
CONFIG_SETS = ["dev-config-5x"]
ROCKSDB_CONFIG_SETS = ["dev-rocksdbconfig-5x"]
DLEDGER_SETS = ["dev-dledger", "dev-dledger-5x"]
DLEDGER_CRASH_SETS = ["dev-dledger-crash", "dev-dledger-5x-crash"]
BATCHCQ_SETS = ["dev-batchcq-5x", "dev-config-5x"]
LMQ_SETS = ["dev-lmq-5x"]
FEATURE_SETS = DLEDGER_SETS + BATCHCQ_SETS + LMQ_SETS + TIMER_SETS
# Older upstream store files live outside the project (not copied); tests using them skip when absent.
UPSTREAM = Path(os.environ.get("RMQTOOL_UPSTREAM_FIXTURES", ROOT.parent / "shared" / "fixtures-upstream"))

settings.register_profile("default", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(items):
    """A Spark test starts a JVM (seconds, before its first job): slow too, so that ``-m 'not slow'`` is the
    quick loop."""
    for item in items:
        if item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.slow)


@lru_cache(maxsize=None)
def made_at(store: Path | str) -> int:
    """A minute after the newest record of ``store`` was stored: a broker started then sees the store as the
    set's readback did. Verdicts that depend on when a broker starts take it (--now, or ``now`` in-process),
    so that no result depends on the day the suite runs."""
    result = run("stats", store, "-f", "jsonl")        # (a torn tail is skipped: exit 3, its record never stored)
    assert result.exit_code in (0, 3) and result.stdout, result.stderr
    return json.loads(result.stdout.splitlines()[0])["max_store_timestamp"] + 60_000


@pytest.fixture
def now():
    """``now(ms)`` pins rmqtool.clock for in-process calls (a CLI run takes --now); unpinned after the test."""
    from rmqtool import clock
    yield clock.pin
    clock.pin(None)


def run(*args, input: bytes | str | None = None, env: dict | None = None):
    """The one way tests run the CLI: in-process, stdout and stderr kept apart, an exception the CLI lets
    escape fails the test (``--traceback`` re-raises, so ``pytest.raises`` sees it)."""
    from click.testing import CliRunner

    from rmqtool.cli import cli
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, env=env, catch_exceptions=False)


def store_path(name: str) -> Path:
    return FIXTURES / name / "store"


@lru_cache(maxsize=None)
def readback(name: str) -> dict:
    """readback.json of a clean set, or recovery-readback.json of a crash set."""
    for fname in ("readback.json", "recovery-readback.json"):
        path = FIXTURES / name / fname
        if path.exists():
            return json.loads(path.read_text("utf-8"))
    raise FileNotFoundError(name)


@lru_cache(maxsize=None)
def manifest(name: str) -> dict:
    return json.loads((FIXTURES / name / "manifest.json").read_text("utf-8"))


def index_queries(rb: dict) -> list[dict]:
    return next(v for k, v in rb.items() if k.startswith("indexQueries"))


@pytest.fixture
def store_copy(tmp_path):
    """Copy a fixture store (by set name, optionally 'recovered-store') into a writable temp dir."""
    def make(name: str, which: str = "store") -> Path:
        dst = tmp_path / name / which
        shutil.copytree(FIXTURES / name / which, dst)
        for p in dst.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst
    return make


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """A multi-file store: 6 commit-log files of 64 KiB, consume queues and small index files."""
    from rmqtool.format.indexfile import Geometry
    from rmqtool.ops.generate import generate_store

    root = tmp_path_factory.mktemp("gen") / "store"
    generate_store(root, 6 * 65536 - 5000, file_size=65536, topics=5, queues=3, cq_file_size=20 * 50,
                   index_geometry=Geometry(50, 200), seed=7)
    return str(root)


@pytest.fixture(scope="session")
def damaged(generated, tmp_path_factory):
    """The generated store with a broken magic code in its third file, a consume-queue file cut
    mid-unit, an index entry pointing nowhere and a record's unit removed."""
    import shutil
    import struct
    from pathlib import Path

    root = tmp_path_factory.mktemp("damaged") / "store"
    shutil.copytree(generated, root)
    third = sorted((root / "commitlog").iterdir())[2]
    data = bytearray(third.read_bytes())
    data[struct.unpack_from(">i", data, 0)[0] + 5] ^= 0xFF        # the second record's magic code
    third.write_bytes(bytes(data))
    queues = sorted(p for p in (root / "consumequeue").rglob("0000*"))
    queues[0].write_bytes(queues[0].read_bytes()[:130])
    units = bytearray(queues[1].read_bytes())
    units[40:60] = bytes(20)                       # the third unit: zero, so the queue ends there
    queues[1].write_bytes(bytes(units))
    index = sorted((root / "index").iterdir())[0]
    data = bytearray(index.read_bytes())
    struct.pack_into(">q", data, 40 + 4 * 50 + 20 * 3 + 4, 12345)
    index.write_bytes(bytes(data))
    return str(Path(root))
