"""Store files as units of bulk work: one commit-log file (or CQ / index file) per unit.

Paths may be local paths or URIs (``hdfs://``, ``s3://``, ``file://``), opened through ``pyarrow.fs``;
glob patterns (``*``, ``?``, ``[...]``) expand per path component. A path may be a store root, its
``commitlog/`` directory or one commit-log file (a DLedger store's commit log is ``dledger-<id>/data/``).
Records never cross a commit-log file, so the files of every store can be decoded independently and in any
order; results are put back in (store, offset) order.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import posixpath
import stat
import urllib.parse
from dataclasses import dataclass, replace
from typing import Callable, Iterator, NamedTuple

from rmqtool import constants as C
from rmqtool.errors import FormatError, RmqError, StoreError, first_line
from rmqtool.store import layout as L
from rmqtool.store.output import ScratchDir

KINDS = ("commitlog", "consumequeue", "batchconsumequeue", "index", "compactionlog", "compactioncq", "trace")
QUEUE_DIRS = {"consumequeue": (L.CONSUMEQUEUE, L.BATCHCONSUMEQUEUE), "batchconsumequeue": (L.BATCHCONSUMEQUEUE,),
              "compactionlog": (posixpath.join(L.COMPACTION, L.COMPACTION_LOG),),
              "compactioncq": (posixpath.join(L.COMPACTION, L.COMPACTION_CQ),)}
_GLOB_CHARS = "*?["
_COPY_CHUNK = 8 << 20
# cat-commitlog and stats over a commit log of up to FEW_BYTES: the record-at-a-time decoder (~30 us a record:
# 2,000 cost ~0.1 CPU-s and 25 MB, the bulk path's start-up alone ~0.35 CPU-s and ~300 MB: numpy, pyarrow, the
# kernel and its first window)
FEW_BYTES = 1 << 20


@dataclass(frozen=True)
class StoreFile:
    """One file of one store. ``uri`` reopens it anywhere (a task on an executor, a local process)."""

    store: str            # the store as the user named it (after glob expansion)
    uri: str              # local absolute path, or scheme://... URI
    start: int            # the offset in the file's name (0 when the name is not an offset)
    size: int
    kind: str = "commitlog"       # or a queue kind; "rocksdbcq": a RocksDB consume queue (the database directory)
    topic: str | None = None      # queue files only
    queue_id: int | None = None   # queue files only

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri)

    @property
    def shown(self) -> str:
        """The file as messages name it: under the store as the user named it (a URI as it is)."""
        if "://" in self.uri:
            return self.uri
        rel = os.path.relpath(self.uri, os.path.abspath(self.store))
        return self.store if rel == "." else self.uri if rel.startswith("..") else os.path.join(self.store, rel)


def filesystem(uri: str):
    """(pyarrow FileSystem, path inside it) for a local path or a URI."""
    from pyarrow import fs

    if "://" not in uri:
        return fs.LocalFileSystem(), os.path.abspath(uri)
    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow raises ArrowInvalid / ArrowNotImplementedError / OSError
        raise StoreError(f"cannot open: {first_line(exc)}", path=uri) from None


def uri_of(base: str, path: str) -> str:
    """The URI of ``path`` found on the filesystem of URI ``base``, percent-encoded (retry and DLQ
    topics hold '%', which pyarrow decodes back when it opens the URI)."""
    scheme, rest = base.split("://", 1)
    quoted = urllib.parse.quote(path, safe="/")
    if not path.startswith("/"):          # s3://, gs://: the path begins with the bucket
        return f"{scheme}://{quoted}"
    return f"{scheme}://{rest.split('/', 1)[0]}{quoted}"


def _is_offset_name(name: str) -> bool:
    return len(name) == C.FILE_NAME_DIGITS and name.isdigit()


class _Info(NamedTuple):
    """A listed path: pyarrow's FileInfo for a URI, os.stat for a local path (listing a local store imports
    no pyarrow)."""

    path: str
    base_name: str
    is_file: bool
    is_dir: bool
    size: int | None              # None: not a file


def _arrow_info(i) -> _Info:
    from pyarrow import fs

    return _Info(i.path, i.base_name, i.type == fs.FileType.File, i.type == fs.FileType.Directory, i.size)


def _info(fsys, path: str) -> _Info | None:
    """The path's info (None when it does not exist); ``fsys`` None: a local path."""
    if fsys is not None:
        from pyarrow import fs

        i = fsys.get_file_info(path)
        return None if i.type == fs.FileType.NotFound else _arrow_info(i)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    is_file = stat.S_ISREG(st.st_mode)
    return _Info(path, posixpath.basename(path), is_file, stat.S_ISDIR(st.st_mode), st.st_size if is_file else None)


def _children(fsys, path: str) -> list[_Info]:
    """The entries of a directory (none when it does not exist), by path; ``fsys`` None: a local path."""
    if fsys is not None:
        from pyarrow import fs

        return sorted(map(_arrow_info, fsys.get_file_info(fs.FileSelector(path, allow_not_found=True))),
                      key=lambda i: i.path)
    try:
        with os.scandir(path) as entries:
            found = [_Info(posixpath.join(path, e.name), e.name, e.is_file(), e.is_dir(),
                           e.stat().st_size if e.is_file() else None) for e in entries]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda i: i.path)


def expand(pattern: str) -> list[str]:
    """The paths a glob pattern names (the pattern itself when it has no wildcard)."""
    if not any(ch in pattern for ch in _GLOB_CHARS):
        return [pattern]
    if "://" not in pattern:
        found = sorted(glob.glob(pattern))
    else:
        found = [uri_of(pattern, p) for p in _remote_glob(pattern)]
    if not found:
        raise StoreError("no store matches this pattern", path=pattern)
    return found


def _remote_glob(pattern: str) -> list[str]:
    fsys, path = filesystem(pattern)
    parts = path.split("/")
    fixed = next(i for i, part in enumerate(parts) if any(ch in part for ch in _GLOB_CHARS))
    found = ["/".join(parts[:fixed]) or "/"]
    for part in parts[fixed:]:
        nxt = []
        for base in found:
            if any(ch in part for ch in _GLOB_CHARS):
                nxt += [i.path for i in _children(fsys, base) if fnmatch.fnmatchcase(i.base_name, part)]
            elif _info(fsys, posixpath.join(base, part)) is not None:
                nxt.append(posixpath.join(base, part))
        found = nxt
    return sorted(found)


def list_files(paths: list[str] | tuple[str, ...], kind: str = "commitlog") -> list[StoreFile]:
    """The files of ``kind`` in every named store, in (argument, store, offset) order. ``consumequeue``
    lists the batch consume queues too (``batchconsumequeue/``, 5.x BatchCQ topics), after the others, and
    a RocksDB consume queue (5.2+ storeType=defaultRocksDB) as one entry, its database directory.
    ``compactionlog`` / ``compactioncq``: the compaction topics' logs and sparse queues (``compaction/``).
    ``trace`` (message-trace contexts, read from the trace topic's records): the commit-log files."""
    if kind not in KINDS:
        raise StoreError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    kind = "commitlog" if kind == "trace" else kind
    out: list[StoreFile] = []
    for pattern in paths:
        for store in expand(str(pattern)):
            out += _store_files(store.rstrip("/") or store, kind)
    return out


def _is_root(names) -> bool:
    return (L.COMMITLOG in names or L.CONSUMEQUEUE in names or L.BATCHCONSUMEQUEUE in names or L.INDEX in names
            or L.CHECKPOINT in names or any(n.startswith(L.DLEDGER_PREFIX) for n in names))


def _not_a_store(store: str, kind: str) -> StoreError | None:
    """Why a local path is refused, found before pyarrow is imported (a shell loop over paths that are not
    stores pays nothing heavy)."""
    if not os.path.exists(store):
        return StoreError("no such file or directory", path=store)
    if kind == "commitlog" and os.path.isdir(store):
        names = os.listdir(store)
        if not _is_root(names) and not any(_is_offset_name(n) for n in names):
            return StoreError("not a RocketMQ store (no commitlog/, consumequeue/, index/ or checkpoint)",
                              path=store)
    return None


def _store_files(store: str, kind: str) -> list[StoreFile]:
    local = "://" not in store
    refused = _not_a_store(store, kind) if local else None
    if refused:
        raise refused
    fsys, path = (None, os.path.abspath(store)) if local else filesystem(store)
    info = _info(fsys, path)
    if info is None:
        raise StoreError("no such file or directory", path=store)

    def entry(i: _Info, **kw) -> StoreFile:
        name = posixpath.basename(i.path)
        return StoreFile(store, i.path if local else uri_of(store, i.path),
                         int(name) if _is_offset_name(name) else 0, i.size or 0, kind, **kw)

    if info.is_file:
        if kind != "commitlog":
            raise StoreError(f"a single file holds no {kind}", path=store)
        return [entry(info)]
    names = {posixpath.basename(i.path): i for i in _children(fsys, path)}
    is_root = _is_root(names)
    if kind == "commitlog":
        if not is_root and not any(_is_offset_name(n) for n in names):
            raise StoreError("not a RocketMQ store (no commitlog/, consumequeue/, index/ or checkpoint)",
                             path=store)
        directory = posixpath.join(path, L.COMMITLOG) if is_root else path
        ledgers = sorted(n for n, i in names.items() if n.startswith(L.DLEDGER_PREFIX) and i.is_dir)
        if is_root and L.COMMITLOG not in names and ledgers:
            directory = posixpath.join(path, ledgers[0], L.DLEDGER_DATA)   # DLedger: records inside the data files
        return [entry(i) for i in _children(fsys, directory)
                if i.is_file and _is_offset_name(posixpath.basename(i.path))]
    if not is_root:
        raise StoreError(f"{kind} needs a store root", path=store)
    if kind == "index":
        return [entry(i) for i in _children(fsys, posixpath.join(path, L.INDEX)) if i.is_file]
    out = []
    for directory in QUEUE_DIRS[kind]:
        queue_kind = "batchconsumequeue" if directory == L.BATCHCONSUMEQUEUE else \
            kind if kind.startswith("compaction") else "consumequeue"
        inside = _children(fsys, posixpath.join(path, directory))
        if directory == L.CONSUMEQUEUE and any(i.base_name == "CURRENT" and i.is_file for i in inside):
            database = _info(fsys, posixpath.join(path, directory))
            out.append(replace(entry(database), size=sum(i.size or 0 for i in inside), kind="rocksdbcq"))
            continue
        for tdir in inside:
            if not tdir.is_dir:
                continue
            qdirs = [q for q in _children(fsys, tdir.path) if q.is_dir and q.base_name.isdigit()]
            for qdir in sorted(qdirs, key=lambda q: int(q.base_name)):
                out += [replace(entry(i, topic=tdir.base_name, queue_id=int(qdir.base_name)), kind=queue_kind)
                        for i in _children(fsys, qdir.path) if i.is_file and _is_offset_name(i.base_name)]
    return out


def readable_files(files: list[StoreFile], read_anyway: bool = False) -> tuple[list[StoreFile], list]:
    """The commit-log files of ``files`` as readers read them (rmqtool.store.readable, per store): a store
    the broker refuses to load is refused (Refused) unless ``read_anyway``; then its files are cut to what is
    readable (``size``) and those off the grid left out. Also what that skips (Skipped, every store)."""
    from rmqtool.store.filequeue import infer_file_size
    from rmqtool.store.readable import Part, readable

    by_store: dict[str, list[StoreFile]] = {}
    for f in files:
        if f.kind == "commitlog":
            by_store.setdefault(f.store, []).append(f)
    kept: dict[str, StoreFile | None] = {}
    skipped: list = []
    for group in by_store.values():
        named = {f.shown: f for f in group}          # the verdict names each file as messages do
        parts = [Part(f.shown, f.start, f.size) for f in group]
        verdict = readable(parts, infer_file_size(parts), lambda name: read_bytes(named[name])).check(read_anyway)
        kept.update({f.uri: replace(f, size=verdict.limits[f.shown]) if f.shown in verdict.limits else None
                     for f in group})
        skipped += verdict.skipped
    out = [kept.get(f.uri, f) if f.kind == "commitlog" else f for f in files]
    return [f for f in out if f is not None], skipped


def sparse_queue_file(f: StoreFile) -> StoreFile | None:
    """The sparse compaction-queue file of a compaction-log file: the same name under compactionCq/
    (CompactionLog: one queue file per log file, named by the log file's start offset)."""
    base, _, topic, qid, name = f.uri.rsplit("/", 4)
    uri = "/".join((base, L.COMPACTION_CQ, topic, qid, name))
    fsys, path = filesystem(uri)
    size = fsys.get_file_info(path).size
    return replace(f, uri=uri, size=size or 0, kind="compactioncq") if size is not None else None


@contextlib.contextmanager
def local_dir(f: StoreFile) -> Iterator[str]:
    """A local path of a directory entry (a RocksDB database): itself, or a temporary copy of its files."""
    if "://" not in f.uri:
        yield f.uri
        return
    fsys, path = filesystem(f.uri)
    with _copies(f, fsys, lambda: [(i.path, i.base_name) for i in _children(fsys, path) if i.is_file]) as tmp:
        yield tmp


@contextlib.contextmanager
def _copies(f: StoreFile, fsys, listing) -> Iterator[str]:
    """A temporary directory holding copies of remote files (``listing()``: their paths and names)."""
    with ScratchDir("rmqtool-remote-") as tmp:
        try:
            for source, name in listing():
                with fsys.open_input_stream(source) as src:
                    _copy(src, os.path.join(tmp, name))
        except OSError as exc:
            if exc.filename is not None and os.path.dirname(exc.filename) == str(tmp):
                raise                   # the copy, not the read, failed (a full temporary directory): named
            raise StoreError(f"cannot read: {exc}", path=f.shown) from None
        yield tmp


def _copy(src, target: str) -> None:
    """``src`` (a stream) into a new file at ``target``; an error writing it names ``target``."""
    from rmqtool.store.atomic import named

    with named(target):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while chunk := src.read(_COPY_CHUNK):
            with named(target):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_bytes(f: StoreFile):
    """The file's bytes as a pyarrow Buffer (memory-mapped when local)."""
    import pyarrow as pa

    fsys, path = filesystem(f.uri)
    try:
        if "://" not in f.uri:
            return pa.memory_map(path, "r").read_buffer()
        with fsys.open_input_file(path) as fh:
            return fh.read_buffer()
    except OSError as exc:
        raise StoreError(f"cannot read: {exc}", path=f.shown) from None


def broker_properties(store: str) -> dict[str, str] | None:
    """A store root's config/broker.properties (as ``Store.broker_properties``, on any filesystem), or None
    (no such file, or the path is no store root)."""
    from pyarrow import fs

    from rmqtool.format.javaprops import parse_java_properties

    fsys, path = filesystem(store)
    path = posixpath.join(path, L.config_file(L.BROKER_PROPERTIES))
    try:
        if fsys.get_file_info(path).type != fs.FileType.File:
            return None
        with fsys.open_input_stream(path) as fh:
            return parse_java_properties(fh.read().decode("latin-1"))
    except OSError as exc:
        raise StoreError(f"cannot read: {exc}", path=store) from None


def first_store_timestamp(f: StoreFile) -> int | None:
    """The store time (ms) of the first record of a commit-log file (inside the first entry of a DLedger
    data file); None when the file does not begin with a message."""
    from rmqtool.format import commitlog, dledger

    fsys, path = filesystem(f.uri)
    try:
        with fsys.open_input_file(path) as fh:
            head = fh.read_at(min(f.size, 4096), 0)
            skip = dledger.HEADER_SIZE if len(head) >= 4 and dledger.peek_magic(head) in dledger.VALID_MAGICS else 0
            size, _ = commitlog.peek_header(head, skip)
            if 0 < size <= f.size - skip and size > len(head) - skip:
                head = fh.read_at(skip + size, 0)
        entry = commitlog.decode_entry(head, skip)
    except (OSError, FormatError):
        return None
    return getattr(entry, "store_timestamp", None)


@contextlib.contextmanager
def local_path(f: StoreFile) -> Iterator[str]:
    """A local path of the file: itself, or a temporary copy of a remote file (same name)."""
    if "://" not in f.uri:
        yield f.uri
        return
    fsys, path = filesystem(f.uri)
    with _copies(f, fsys, lambda: [(path, f.name)]) as tmp:
        yield os.path.join(tmp, f.name)


def warm(f: StoreFile, step: Callable | None = None, windows: Callable | None = None, **options) -> None:
    """Decode the first batch of the local file ``f`` (``record_batches``' options) and hand it to ``step``,
    or hand ``windows`` the first window it takes, in this process, before worker processes are forked from
    it: the compiled decode (and what ``step`` or ``windows`` compiles) is loaded once here, not again from
    the cache in every worker (~0.25 CPU-s apiece). Damage and unreadable files are left to the real pass."""
    if "://" in f.uri:
        return

    def first(data, win, file_start: int) -> bool:
        if windows(data, win, file_start):
            raise _Warmed
        return False

    batches = record_batches(f, windows=first if windows is not None else None, **options)
    try:
        batch = next(batches, None)
        if batch is not None and step is not None:
            step(batch)
    except (RmqError, OSError, _Warmed):
        pass
    finally:
        batches.close()


class _Warmed(Exception):
    """Out of the first window a warm-up's ``windows`` took: its code is loaded; the rest is the real pass's."""


def record_batches(f: StoreFile, *, check_crc: bool = False, decompress: bool = False,
                   on_damage: Callable[[FormatError], None] | None = None,
                   progress: Callable[[int], None] | None = None, columns: list[str] | None = None,
                   select: tuple[list[str], Callable] | None = None, windows: Callable | None = None) -> Iterator:
    """Arrow record batches of one commit-log file (``rmqtool.columnar.record_schema``); errors name
    ``f.shown``. With ``decompress``, compressed bodies (and their body_length) are decompressed.
    ``progress(n)`` is told the bytes scanned after each batch (the whole file in all). A compaction-log
    file (kind ``compactionlog``) gives what a consumer of its queue reads: ``consumer_view``. ``columns``:
    the columns a caller reads (``iter_record_batches``; BLANK rows come whole), where the file allows;
    ``select``: only the records a filter wants, decoded whole (``iter_record_batches``), where it allows;
    ``windows``: the scan's windows offered to it first (``iter_record_batches``), where ``columns`` holds."""
    from rmqtool.columnar import iter_record_batches

    counted = BytesCounter(f.start, progress)
    named = consumer_view(f) if f.kind == "compactionlog" else None

    def relabel(exc: RmqError) -> RmqError:
        exc.path = f.shown
        return exc

    if named is not None:
        select = None
    if columns is not None and (named is not None or decompress):
        columns = None
    elif columns is not None:                   # what BytesCounter reads
        columns = list(dict.fromkeys([*columns, "physical_offset", "total_size"]))

    def counted_windows(data, win, file_start: int) -> bool:
        """``windows``, its windows taken counted as scanned."""
        taken = windows(data, win, file_start)
        if taken:
            counted.reach(file_start + win.next)
        return taken

    offered = counted_windows if windows is not None and columns is not None else None
    with local_path(f) as path:
        try:
            for batch in iter_record_batches(cut_commitlog(path, f.size), check_crc=check_crc, columns=columns,
                                             select=select, windows=offered,
                                             on_damage=on_damage and (lambda e: on_damage(relabel(e)))):
                counted(batch)
                if named is not None:
                    import pyarrow.compute as pc

                    batch = batch.filter(pc.is_in(batch.column("physical_offset"), value_set=named))
                yield decompress_bodies(batch) if decompress else batch
        except FormatError as exc:
            raise relabel(exc) from None
        except StoreError as exc:       # the file refused as it was opened (rmqtool.store.recognition)
            raise (relabel(exc) if exc.path == path else exc) from None
    counted.finish(f.size)


def cut_commitlog(path: str, size: int):
    """The commit log of one file, read up to ``size`` bytes (readable_files cut it to what is readable)."""
    from rmqtool.store.filequeue import FileQueue
    from rmqtool.store.store import Store

    cl = Store.open(path).commitlog
    files = cl.queue.files
    if len(files) == 1 and files[0].length > size:
        cl = type(cl)(FileQueue([replace(files[0], limit=size)], cl.queue.file_size))
    return cl


class Irregular(Exception):
    """A record a small-store path (record by record) would not read exactly as the Arrow path: the Arrow path
    is taken instead."""


def odd_property(raw: bytes, key: str, props: dict[str, str]) -> bool:
    """Might the Arrow path read property ``key`` otherwise than ``props`` (the record-at-a-time parse) has it:
    named more than once, dropped by the parse, or a value holding a name-value separator?"""
    from rmqtool.format.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

    item = (key + NAME_VALUE_SEPARATOR).encode()
    named = raw.count(PROPERTY_SEPARATOR.encode() + item) + raw.startswith(item)
    return named > 1 or (named == 1) != (key in props) or NAME_VALUE_SEPARATOR in props.get(key, "")


def record_messages(raw: bytes, props: dict[str, str]) -> int:
    """The messages of a MESSAGE record with PROPERTIES ``raw`` (parsed: ``props``) as
    ``facts.message_counts`` counts them: INNER_NUM of an inner batch, else 1. Irregular where the Arrow count
    might differ (an odd INNER_NUM or INNER_BASE, a non-ASCII digit, beyond int64)."""
    inner = (C.PROPERTY_INNER_NUM, C.PROPERTY_INNER_BASE)
    if any(odd_property(raw, k, props) for k in inner):
        raise Irregular
    num, base = (props.get(k) for k in inner)
    if num is None or base is None:
        return 1
    if not num.isascii() or (num.isdigit() and (len(num) > 19 or int(num) >= 1 << 63)):
        raise Irregular                                   # beyond int64 (Arrow's cast), or a non-ASCII digit
    return int(num) if num.isdigit() else 1


def consumer_view(f: StoreFile):
    """The compaction-log offsets (an Arrow array) of the records a consumer of the queue reads from one
    compaction-log file (CompactionStore.getMessage): those its sparse-queue file names. A BLANK, the zeros
    after the last rewritten file's data and a record past the queue's last unit (cut off when the broker
    loads the log, SparseConsumeQueue.recover) are no message of the topic."""
    import pyarrow as pa

    from rmqtool.format.batchcq import valid_units

    cq = sparse_queue_file(f)
    units = valid_units(read_bytes(cq)) if cq is not None else None
    return pa.array(units["physical_offset"].astype("int64") if units is not None else [], pa.int64())


class BytesCounter:
    """Turns record batches into ``progress(n)`` calls: the bytes from ``start`` to each batch's end."""

    def __init__(self, start: int, progress: Callable[[int], None] | None):
        self.start, self.done, self.progress = start, 0, progress

    def __call__(self, batch) -> None:
        if self.progress is None or not batch.num_rows:
            return
        self.reach(batch.column("physical_offset")[-1].as_py() + batch.column("total_size")[-1].as_py())

    def reach(self, offset: int) -> None:
        """The bytes scanned up to physical offset ``offset``."""
        end = offset - self.start
        if self.progress is not None and end > self.done:
            self.progress(end - self.done)
            self.done = end

    def finish(self, total: int) -> None:
        if self.progress is not None and total > self.done:
            self.progress(total - self.done)
            self.done = total


def body_of(body: bytes, sys_flag: int, offset: int) -> bytes:
    """The body as the producer sent it (decompressed when the COMPRESSED bit is set)."""
    from rmqtool.format.commitlog import decompress_body

    if not sys_flag & C.SysFlag.COMPRESSED:
        return body
    try:
        return decompress_body(body, sys_flag)
    except FormatError as exc:
        raise exc.at(offset=offset) from None


def decompress_bodies(batch):
    """The batch with compressed bodies replaced by what the producer sent (as rows.entry_row does)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    flags = batch.column("sys_flag")
    compressed = pc.fill_null(pc.not_equal(pc.bit_wise_and(flags, int(C.SysFlag.COMPRESSED)), 0), False)
    rows = np.flatnonzero(compressed.to_numpy(zero_copy_only=False))
    if not len(rows):
        return batch
    bodies = batch.column("body").to_pylist()
    sys_flags = flags.to_pylist()
    offsets = batch.column("physical_offset").to_pylist()
    for i in rows:
        bodies[i] = body_of(bodies[i], sys_flags[i], offsets[i])
    body = pa.array(bodies, pa.binary())
    cols = dict(zip(batch.schema.names, batch.columns))
    cols["body"] = body
    cols["body_length"] = pc.if_else(pc.is_null(batch.column("body_length")), None,
                                     pc.binary_length(body).cast(pa.int32()))
    return pa.RecordBatch.from_arrays([cols[n] for n in batch.schema.names], schema=batch.schema)
