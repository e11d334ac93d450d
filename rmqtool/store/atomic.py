"""Crash-safe changes to a store: backup, staged files, a journal as the commit point, roll forward.

A ``Transaction`` collects whole-file writes, deletions and directory swaps. ``commit()``:
1. copies every touched path into the backup directory and writes its ``manifest.json`` (fsynced);
2. writes each new file or directory beside its target as ``<name>.rmqtool-new`` (fsynced);
3. writes ``.rmqtool-journal.json`` in the store root: the commit point;
4. renames the staged files over their targets and deletes what goes away, fsyncing directories;
5. removes the journal.
A process killed before step 3 leaves the old store (plus staged files, which ``complete_pending``
removes); killed after it, ``complete_pending`` finishes the same steps: never a mix of old and new.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path, PurePosixPath

from rmqtool import clock
from rmqtool.errors import RmqError, UnsafeWrite, WriteFailed
from rmqtool.store.bounds import PlanSize, file_data
from rmqtool.store.filequeue import data_extents, read_exact

JOURNAL = ".rmqtool-journal.json"
STAGED = ".rmqtool-new"
OLD = ".rmqtool-old"
BUILD = ".rmqtool-build"         # a directory being built before it is staged
FAULT_ENV = "RMQTOOL_FAULT_KILL_AT"   # test hook: SIGKILL this process at the Nth fault point
_fault_count = 0


def fault_point() -> None:
    """A place where a crash must leave the store intact (fault-injection tests kill the process here)."""
    global _fault_count
    target = os.environ.get(FAULT_ENV)
    if target:
        _fault_count += 1
        if _fault_count == int(target):
            os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def named(path) -> None:
    """An OSError raised inside names ``path`` (one from a write or an fsync on an open file names none)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def fsync_dir(path: Path) -> None:
    with named(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(path: Path) -> None:
    with named(path), open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with named(path), open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def failed(exc: BaseException, state: str, where: Path | None = None) -> WriteFailed:
    """An error of a change as one line: the path (``where`` when the error names none), what failed,
    and the state the store is in."""
    if isinstance(exc, OSError):
        path, why = exc.filename, exc.strerror or str(exc)
    else:
        path, why = getattr(exc, "path", None), getattr(exc, "message", str(exc))
    path = path if path is not None else where
    return WriteFailed(f"{why}; {state}", path=None if path is None else str(path))


def remove_scratch(path: Path) -> None:
    """Remove a scratch directory outside the store (an error names the file that could not go)."""
    _remove(Path(path))


def _unflushed(what: str) -> str:
    return f"{what}, but could not be flushed to disk: a power loss may undo it (run sync once the disk is sound)"


def store_state(root: Path) -> str:
    """What a write that failed left in ``root``, and what finishes it (for its error line)."""
    root = Path(root)
    journal = root / JOURNAL
    if journal.exists():
        try:
            lines = journal.read_text("utf-8").splitlines()
            head = json.loads(lines[0]) if lines else {"mode": "undo"}     # as complete_pending reads it
        except (OSError, ValueError):
            head = {}
        fix = f"the next write command (or rmqtool repair {root} --apply)"
        if head.get("mode") != "undo":
            return f"the change is committed but not finished; {fix} finishes it"
        if (Path(head.get("backup", "")) / "manifest.json").is_file():
            return f"the change is applied (backup in {head['backup']}); {fix} removes its journal"
        return f"the change is half-made; {fix} undoes it"
    if any(p.name.endswith((STAGED, OLD, BUILD)) for p in _walk(root)):
        return "the store is unchanged; the next write command removes the staged files left in it"
    return "the store is unchanged"


def _best_effort(clean_up, *args) -> None:
    """Clean-up after an error: a failure here must not hide the error being reported."""
    with contextlib.suppress(OSError, RmqError):
        clean_up(*args)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace one file: temp file beside it, fsync, rename, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + STAGED)
    try:
        _write_synced(tmp, data)
        with named(path):
            os.replace(tmp, path)
    except BaseException:
        _best_effort(_remove, tmp)
        raise
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        raise failed(exc, _unflushed(f"{path} is written")) from None


def preallocate(path: Path, size: int) -> None:
    """A new file of ``size`` zero bytes, sparse (as the broker's MappedFile pre-allocates: no data block
    until written), made durable."""
    with named(path), open(path, "xb") as fh:
        fh.truncate(size)
        os.fsync(fh.fileno())
    fsync_dir(Path(path).parent)


def check_room(where: Path, nbytes: int, nfiles: int, what: str) -> None:
    """Refuse (UnsafeWrite: exit 4, nothing written) a plan needing more bytes or inodes than the file
    system holding ``where`` has free (statvfs: f_bavail, f_favail)."""
    probe = Path(where)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    fs = os.statvfs(probe)
    free, inodes = fs.f_bavail * fs.f_frsize, fs.f_favail
    if nbytes > free or (fs.f_files and nfiles > inodes):
        raise UnsafeWrite(f"{what} needs {nbytes} bytes in {nfiles} file(s); the file system has {free} bytes "
                          f"and {inodes} inodes free: nothing written", path=str(where))


def _device(path: Path) -> int:
    """The device of ``path``, or of its nearest existing parent."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.stat().st_dev


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_backup_dir(root: Path) -> Path:
    stamp = clock.system_now().strftime("%Y%m%d-%H%M%S-%f")
    return root.parent / f"{root.name}.rmqtool-backup-{stamp}"


class Transaction:
    """All-or-nothing change of files under one store root (paths are relative to it)."""

    def __init__(self, root: Path, backup_dir: Path | None = None, *, label: str = "change"):
        self.root = Path(root)
        self.backup_dir = backup_dir
        self.label = label
        self.writes: dict[str, bytes] = {}
        self.deletes: list[str] = []
        self.dirs: dict[str, Path] = {}          # target dir -> a directory built elsewhere (moved in)

    def write(self, rel: str, data: bytes | Path) -> None:
        """``rel`` gets ``data`` (bytes-like, or the content of a file built elsewhere)."""
        self.writes[rel] = data

    def delete(self, rel: str) -> None:
        if (self.root / rel).exists() and rel not in self.deletes:
            self.deletes.append(rel)

    def replace_dir(self, rel: str, built: Path) -> None:
        """Swap in ``built`` (a directory on the same file system) as ``rel``; the transaction owns it from
        here (a commit that fails before its commit point removes it)."""
        self.dirs[rel] = Path(built)

    @property
    def empty(self) -> bool:
        return not (self.writes or self.deletes or self.dirs)

    def touched(self) -> list[str]:
        return sorted(set(self.writes) | set(self.deletes) | set(self.dirs))

    def commit(self) -> Path | None:
        """Apply the change; returns the backup directory (None when there was nothing to do)."""
        if self.empty:
            return None
        if pending_journal(self.root):
            raise UnsafeWrite("an interrupted change is pending; complete it first", path=str(self.root / JOURNAL))
        backup = self.backup_dir or default_backup_dir(self.root)
        ops: list[list[str]] = []
        made = [backup] if not backup.exists() else [backup / rel for rel in self.touched()] + [
            backup / "manifest.json"]              # a backup directory given: only what goes into it
        try:
            self._check_room(backup)
            self._backup(backup)
            self._stage(ops)
            ops += [["delete", rel] for rel in self.deletes]
            for parent in {(self.root / op[-1]).parent for op in ops}:
                if parent.exists():
                    fsync_dir(parent)
            journal = {"label": self.label, "backup": str(backup), "ops": ops}
            _write_synced(self.root / (JOURNAL + STAGED), json.dumps(journal).encode())
            with named(self.root / JOURNAL):
                os.replace(self.root / (JOURNAL + STAGED), self.root / JOURNAL)
        except BaseException:                  # before the commit point: no staged file stays behind
            for staged in [self.root / op[1] for op in ops if op[0] != "delete"] + [
                    self.root / (rel + STAGED) for rel in self.dirs] + list(self.dirs.values()) + [
                    self.root / (JOURNAL + STAGED)] + made:      # nor a partial backup
                _best_effort(_remove, staged)
            raise
        try:                                   # an error from here leaves the journal (the next write rolls
            fsync_dir(self.root)               # forward) or, once it is gone, an unflushed change
            fault_point()
            _roll_forward(self.root, ops)
        except (OSError, RmqError) as exc:
            state = store_state(self.root) if pending_journal(self.root) else \
                _unflushed(f"the change is applied (backup in {backup})")
            raise failed(exc, state) from None
        return backup

    def _check_room(self, backup: Path) -> None:
        """The staged files and the backup against the free bytes and inodes (check_room)."""
        new = [len(data) if not isinstance(data, Path) else data.stat().st_blocks * 512
               for data in self.writes.values()]
        saved = [p.stat().st_blocks * 512 for p in (self.root / rel for rel in self.touched()) if p.is_file()]
        linked = _device(backup) == _device(self.root)          # a backup of hard links takes inodes only
        check_room(self.root, sum(new) + (0 if linked else sum(saved)), len(new) + len(saved) + 2,
                   f"the {self.label}")

    def _stage(self, ops: list[list[str]]) -> None:
        """Each new file and directory beside its target (``ops`` gets what is staged, as it goes)."""
        for rel, data in self.writes.items():
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            ops.append(["replace", rel + STAGED, rel])
            staged = target.with_name(target.name + STAGED)
            if isinstance(data, Path):               # a file built elsewhere: its data regions copied
                copy_sparse(data, staged)
                _fsync_file(staged)
            else:
                _write_synced(staged, data)
            fault_point()
        for rel, built in self.dirs.items():
            staged = self.root / (rel + STAGED)
            if staged.exists():
                shutil.rmtree(staged)
            staged.parent.mkdir(parents=True, exist_ok=True)
            _fsync_tree(built)
            with named(staged):
                os.rename(built, staged)
            fault_point()
            ops.append(["swapdir", rel + STAGED, rel])

    def _backup(self, backup: Path) -> None:
        backup.mkdir(parents=True, exist_ok=True)
        entries = []
        for rel in self.touched():
            src = self.root / rel
            dst = backup / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True, copy_function=link_or_copy)
                _fsync_tree(dst)
                entries.append({"path": rel, "kind": "dir"})
            elif src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(src, dst)
                _fsync_file(dst)
                entries.append({"path": rel, "kind": "file", "sha256": _sha256(dst)})
            else:
                entries.append({"path": rel, "kind": "absent"})
        manifest = {"store": str(self.root.resolve()), "label": self.label,
                    "created": clock.system_now().astimezone(dt.timezone.utc).isoformat(), "entries": entries}
        _write_synced(backup / "manifest.json", json.dumps(manifest, indent=1).encode())
        fsync_dir(backup)
        fault_point()


def link_or_copy(src, dst) -> None:
    """Back a file up as a hard link: a change never writes into a store file in place (it stages a
    new file and renames it over, or swaps a directory), so the linked inode keeps the old bytes.
    Across file systems, a copy that keeps the holes of sparse files."""
    try:
        os.link(src, dst)
    except OSError:
        copy_sparse(src, dst)


def copy_sparse(src, dst) -> None:
    """Copy a file's data regions only (holes stay holes), with its times and mode."""
    with named(dst), open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        for lo, hi in data_extents(fin.fileno(), 0, size):
            fin.seek(lo)
            fout.seek(lo)
            for pos in range(lo, hi, 1 << 20):
                fout.write(fin.read(min(1 << 20, hi - pos)))
        fout.truncate(size)
    shutil.copystat(src, dst)


def _fsync_tree(path: Path) -> None:
    for d, _, files in os.walk(path):
        for f in files:
            _fsync_file(Path(d) / f)
        fsync_dir(Path(d))


def _remove(path: Path) -> None:
    """Remove a file or a tree; an error names the path that could not go."""
    def named(_func, failed, exc_info) -> None:
        exc = exc_info[1]
        raise OSError(exc.errno, f"cannot remove: {exc.strerror or exc}", str(failed)) from None

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=named)
    elif path.exists() or path.is_symlink():
        try:
            path.unlink()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot remove: {exc.strerror or exc}", str(path)) from None


def _roll_forward(root: Path, ops: list[list[str]]) -> None:
    """Apply journal operations; each one is idempotent, so a repeated run finishes the job."""
    for op in ops:
        if op[0] == "replace":
            src, dst = root / op[1], root / op[2]
            if src.exists():
                with named(dst):
                    os.replace(src, dst)
                fsync_dir(dst.parent)
        elif op[0] == "swapdir":
            src, dst = root / op[1], root / op[2]
            old = dst.with_name(dst.name + OLD)
            if src.exists():
                if dst.exists():
                    if old.exists():
                        _remove(old)
                    with named(dst):
                        os.rename(dst, old)
                    fault_point()
                with named(dst):
                    os.rename(src, dst)
                fsync_dir(dst.parent)
            if old.exists():
                _remove(old)
        elif op[0] == "delete":
            path = root / op[1]
            if path.exists():
                _remove(path)
                fsync_dir(path.parent)
        fault_point()
    with named(root / JOURNAL):
        (root / JOURNAL).unlink(missing_ok=True)
    fsync_dir(root)


def pending_journal(root: Path) -> Path | None:
    path = Path(root) / JOURNAL
    return path if path.exists() else None


def complete_pending(root: Path) -> str:
    """Finish an interrupted commit (journal present), undo an interrupted in-place change, or drop staged
    leftovers of one that never reached its commit point. Says what it did ("" when nothing)."""
    root = Path(root)
    journal = root / JOURNAL
    if journal.exists():
        lines = journal.read_text("utf-8").splitlines()
        try:
            head = json.loads(lines[0]) if lines else {"mode": "undo"}
            if head.get("mode") == "undo" and "backup" in head and (Path(head["backup"]) / "manifest.json").is_file():
                journal.unlink()                 # an in-place change whose commit point was passed: it stands
                fsync_dir(root)
                return "completed"
            if head.get("mode") == "undo":
                _undo(root, _steps(lines[1:]), Path(head["backup"]) if "backup" in head else root)
                if "backup" in head and not (Path(head["backup"]) / "manifest.json").exists():
                    shutil.rmtree(head["backup"], ignore_errors=True)   # the pre-images of a change undone
                journal.unlink()
                fsync_dir(root)
                return "undid"
            ops = head["ops"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UnsafeWrite(f"unreadable journal of an interrupted change: {exc}", path=str(journal)) from None
        _roll_forward(root, ops)
        return "completed"
    leftovers = [p for p in _walk(root) if p.name.endswith((STAGED, OLD, BUILD))]
    for p in leftovers:
        _remove(p)
    return "removed the staged files of" if leftovers else ""


def _walk(root: Path):
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(d) / name


def confined(base: Path, rel) -> Path:
    """``base / rel`` for a manifest path that stays inside ``base``: relative, no ``..``, no symbolic
    link on the way (a backup is untrusted input; UnsafeWrite otherwise)."""
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".") for p in parts) or "\\" in rel:
        raise UnsafeWrite(f"backup manifest path {rel!r} is not a plain path inside the store", path=str(base))
    path = Path(base)
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise UnsafeWrite("a symbolic link where a backup puts a path back", path=str(path))
    return path


_KINDS = ("file", "dir", "absent", "ranges", "created_dir", "removed")   # the entries a backup manifest holds


def read_backup(backup: Path) -> dict:
    """A backup's manifest, every path confined to the backup and the store, every file checked against
    its recorded SHA-256 (UnsafeWrite when one is missing or differs: such a backup is not put back)."""
    backup = Path(backup)
    try:
        manifest = json.loads((backup / "manifest.json").read_text("utf-8"))
        entries = manifest["entries"]
        if not all(isinstance(e, dict) and e.get("kind") in _KINDS for e in entries):
            raise ValueError(f"an entry is not {{path, kind: {'|'.join(_KINDS)}}}")
    except FileNotFoundError:
        raise UnsafeWrite("not an rmqtool backup (no manifest.json)", path=str(backup)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UnsafeWrite(f"unreadable backup manifest: {exc}", path=str(backup / "manifest.json")) from None
    if "preimages" in manifest:
        blob = confined(backup, manifest["preimages"])
        if not blob.is_file() or _sha256(blob) != manifest.get("preimages_sha256"):
            raise UnsafeWrite("backup file missing or changed since the backup was made", path=str(blob))
    for entry in entries:
        path = confined(backup, entry.get("path"))
        if entry["kind"] == "removed":
            confined(backup, entry.get("kept"))
        if entry["kind"] == "dir" and path.is_dir():
            links = [p for p in _walk(path) if p.is_symlink()]
            if links:
                raise UnsafeWrite("a symbolic link inside a backed-up directory", path=str(links[0]))
        if entry["kind"] == "file" and (not path.is_file() or _sha256(path) != entry["sha256"]):
            raise UnsafeWrite("backup file missing or changed since the backup was made", path=str(path))
        if entry["kind"] == "dir" and not path.is_dir():
            raise UnsafeWrite("backup directory missing", path=str(path))
    return manifest


def restore_plan(backup: Path, root: Path) -> list[dict]:
    """What restoring ``backup`` into ``root`` changes: one {action, path, detail} row per path that
    differs from the backup (empty when the store already matches it)."""
    rows = []
    for entry in read_backup(backup)["entries"]:
        rel, kind = entry["path"], entry["kind"]
        target = confined(Path(root), rel)
        if kind == "file":
            if not target.is_file() or _sha256(target) != entry["sha256"]:
                rows.append({"action": "restore_file", "path": rel, "detail": "put back the backed-up file"})
        elif kind == "dir":
            if not target.is_dir() or _tree_digest(target) != _tree_digest(Path(backup) / rel):
                rows.append({"action": "restore_dir", "path": rel, "detail": "put back the backed-up directory"})
        elif kind == "ranges":
            if entry["size"] is None:
                if target.exists():
                    rows.append({"action": "delete", "path": rel, "detail": "absent before the change"})
            elif not target.is_file() or not _ranges_match(target, entry, Path(backup)):
                rows.append({"action": "restore_ranges", "path": rel, "detail":
                             f"put back {len(entry['ranges'])} byte range(s) and the size {entry['size']}"})
        elif kind == "created_dir":
            continue
        elif kind == "removed":
            if not target.exists():
                rows.append({"action": "restore_file", "path": rel, "detail": "put back the file the change removed"})
        elif target.exists():
            rows.append({"action": "delete", "path": rel, "detail": "absent before the change"})
    return rows


def restore_size(backup: Path, root: Path, rows: list[dict]) -> PlanSize:
    """What restoring ``rows`` (restore_plan) creates (the backed-up files absent from the store), changes and
    deletes (store.bounds)."""
    size = PlanSize()
    for row in rows:
        rel, target = row["path"], confined(Path(root), row["path"])
        if row["action"] == "delete":
            size.deleted += 1
        elif target.exists() or row["action"] == "restore_ranges":
            size.changed += 1
        else:
            kept = Path(backup) / rel
            kept = kept if kept.exists() else Path(backup) / "removed" / rel
            if kept.is_dir():
                size.add_tree(kept, rel)
            elif kept.is_file():
                size.create(rel, *file_data(kept))
    return size


def _preimage(entry_range: list, backup: Path) -> bytes:
    offset, length, at = entry_range
    if at is None:
        return bytes(length)
    with open(backup / PREIMAGES, "rb") as fh:
        return read_exact(fh, length, at)


def _ranges_match(target: Path, entry: dict, backup: Path) -> bool:
    """Whether ``target`` holds the pre-change bytes of every range and the pre-change size (the last
    pre-image of a range wins: it is the oldest)."""
    if target.stat().st_size != entry["size"]:
        return False
    want: dict[int, bytes] = {}
    for r in entry["ranges"]:
        want[r[0]] = _preimage(r, backup)          # later steps of one range hold older bytes
    with open(target, "rb") as fh:
        return all(read_exact(fh, len(data), offset) == data for offset, data in want.items())


def _tree_digest(path: Path) -> list[tuple[str, str]]:
    return sorted((str(p.relative_to(path)), _sha256(p) if p.is_file() else "dir") for p in _walk(path))


def undo_dir(backup: Path) -> Path:
    """Where restoring ``backup`` keeps the state it replaces (so that a restore can be undone too)."""
    backup = Path(backup)
    stamp = clock.system_now().strftime("%Y%m%d-%H%M%S-%f")
    return backup.with_name(f"{backup.name}.undo-{stamp}")


def restore_backup(backup: Path, root: Path, undo: Path | None = None) -> Path | None:
    """Put every path of a backup back as it was (files absent before the change are removed), in one
    transaction whose own backup (``undo``, default beside ``backup``) holds the state replaced.
    Returns that backup (None when the store already matched)."""
    backup = Path(backup)
    manifest = read_backup(backup)
    if "preimages" in manifest:
        return _restore_ranges(manifest, backup, Path(root), undo or undo_dir(backup))
    txn = Transaction(Path(root), undo or undo_dir(backup), label="restore")
    for entry in manifest["entries"]:
        rel = entry["path"]
        confined(Path(root), rel)
        if entry["kind"] == "file":
            txn.write(rel, backup / rel)             # copied where it holds data (sparse), not read whole
        elif entry["kind"] == "dir":
            built = Path(root) / (rel + BUILD)
            _remove(built)
            shutil.copytree(backup / rel, built, copy_function=copy_sparse)   # new inodes
            txn.replace_dir(rel, built)
        else:
            txn.delete(rel)
    return txn.commit()


# -- changes in place: an undo journal of the byte ranges touched ------------------------------------
PREIMAGES = "preimages.bin"


class PatchTransaction:
    """Bytes written where they go (appends, a few units, a header), with an undo journal.

    Before any byte of a file changes, the journal (``.rmqtool-journal.json``: a header line, then one
    JSON line per step, fsynced) holds what is needed to undo it: the file's old size (or that it was
    absent), and each range's old bytes (in ``preimages.bin`` of the backup, or just "zeros"). Writes are
    buffered and applied ``FLUSH_BYTES`` at a time, so any amount of data streams through one transaction.
    ``commit`` fsyncs the files and renames the backup's manifest in (the commit point), then removes the
    journal. A process killed before the commit point leaves the journal, and the next command rolls the
    store back (``complete_pending``); killed after it, the next command only removes the journal. The
    backup is proportional to the change; a change rolled back leaves none.
    """

    FLUSH_BYTES = 16 << 20

    def __init__(self, root: Path, backup_dir: Path | None = None, *, label: str = "change",
                 dry_run: bool = False):
        self.root = Path(root)
        self.dry_run = dry_run
        self.plan: dict[str, dict] = {}                   # a dry run's files: rel -> created size, bytes written
        if not dry_run and pending_journal(self.root):
            raise UnsafeWrite("an interrupted change is pending; run repair to finish or undo it",
                              path=str(self.root / JOURNAL))
        self.backup = Path(backup_dir) if backup_dir is not None else default_backup_dir(self.root)
        self.label = label
        self.pending: dict[str, dict[int, bytes]] = {}     # rel -> offset -> bytes, not yet journalled
        self.pending_bytes = 0
        self.sizes: dict[str, int] = {}                    # rel -> size before the change (-1: absent)
        self.ranges: dict[str, list[list]] = {}            # rel -> [offset, length, preimage at | None]
        self.dirs: list[str] = []                           # directories created (removed on undo)
        self.removed: list[str] = []                        # files moved into the backup
        self._journal = None
        self._blob = None
        self._made_backup = False

    # -- what the writers call -----------------------------------------------------------------------
    def write_at(self, rel: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` of ``rel`` (created when absent) at the next flush."""
        if self.dry_run:
            self._planned(rel)["bytes"] += len(data)
        elif data:
            self.pending.setdefault(rel, {})[offset] = bytes(data)
            self.pending_bytes += len(data)
            if self.pending_bytes >= self.FLUSH_BYTES:
                self.flush()

    def create(self, rel: str, size: int) -> None:
        """A new file of ``size`` bytes, sparse (pre-allocated as the broker's mapped files are)."""
        path = self.root / rel
        if rel not in self.sizes and path.exists():
            raise UnsafeWrite("file to create exists already", path=str(path))
        self.resize(rel, size, created=True)

    def resize(self, rel: str, size: int, *, created: bool = False) -> None:
        """Make ``rel`` ``size`` bytes long (a longer file is sparse at its end)."""
        if self.dry_run:
            self._planned(rel)["created" if created else "resized"] = size
            return
        self._begin_file(rel)
        self._truncate(self.root / rel, size)

    def remove(self, rel: str) -> None:
        """Remove a file (or an empty directory): it is moved into the backup, whence an undo brings it back."""
        path, kept = self.root / rel, self.backup / "removed" / rel
        self._log({"moved": rel, "to": str(kept)})
        self._sync_journal()
        kept.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, kept)
        except OSError:                          # another file system: copy, then remove
            if path.is_dir():
                kept.mkdir(exist_ok=True)
                path.rmdir()
            else:
                copy_sparse(path, kept)
                path.unlink()
        fsync_dir(path.parent)
        self.removed.append(rel)

    def planned(self, rel: str) -> bool:
        return rel in self.plan

    def _planned(self, rel: str) -> dict:
        return self.plan.setdefault(rel, {"bytes": 0})

    def plan_rows(self) -> list[dict]:
        """A dry run's plan: one {action, path, detail} row per file created or written."""
        return [{"action": "create_file" if "created" in p else "write_file", "path": rel,
                 "detail": (f"new file of {p['created']} bytes (sparse), " if "created" in p else "")
                 + f"{p['bytes']} bytes written in place"} for rel, p in sorted(self.plan.items())]

    def plan_size(self) -> PlanSize:
        """A dry run's plan as a store.bounds.PlanSize: files created (bytes written, the rest sparse), files
        written in place (changed)."""
        size = PlanSize()
        for rel, p in sorted(self.plan.items()):
            if "created" in p:
                size.create(rel, p["bytes"], p["created"])
            else:
                size.changed += 1
                size.data += p["bytes"]
        return size

    @property
    def empty(self) -> bool:
        return not (self.pending or self.sizes or self.removed)

    # -- journal ---------------------------------------------------------------------------------------
    def _log(self, step: dict) -> None:
        if self._journal is None:
            if (self.backup / "manifest.json").exists():
                raise UnsafeWrite("the backup directory holds a backup already", path=str(self.backup))
            self._made_backup = not self.backup.exists()
            self.backup.mkdir(parents=True, exist_ok=True)
            self._blob = open(self.backup / PREIMAGES, "w+b")
            fsync_dir(self.backup.parent)
            self._journal = open(self.root / JOURNAL, "w", encoding="utf-8")
            self._journal.write(json.dumps({"label": self.label, "backup": str(self.backup), "mode": "undo"}) + "\n")
            fsync_dir(self.root)
        with named(self.root / JOURNAL):
            self._journal.write(json.dumps(step) + "\n")

    def _sync_journal(self) -> None:
        if self._journal is not None:
            with named(self.backup / PREIMAGES):
                self._blob.flush()
                os.fsync(self._blob.fileno())
            with named(self.root / JOURNAL):
                self._journal.flush()
                os.fsync(self._journal.fileno())

    def _begin_file(self, rel: str, sync: bool = True) -> None:
        """Journal ``rel``'s size before it changes (durable now unless ``sync`` is off: the caller syncs
        the journal before the first byte of it is written)."""
        if rel in self.sizes:
            return
        path = self.root / rel
        missing = []
        parent = path.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for d in reversed(missing):
            self._log({"mkdir": str(d.relative_to(self.root).as_posix())})
            self.dirs.append(str(d.relative_to(self.root).as_posix()))
        size = path.stat().st_size if path.exists() else -1
        self.sizes[rel] = size
        self._log({"file": rel, "size": size})
        if sync or missing:
            self._sync_journal()                   # the undo record is durable before the file changes
        for d in reversed(missing):
            d.mkdir()
            fsync_dir(d.parent)

    def flush(self) -> None:
        """Journal the pre-images of the pending writes, then apply them."""
        if self.dry_run or not self.pending:
            return
        for rel in self.pending:
            self._begin_file(rel, sync=False)     # synced with the ranges' records below
        self.pending = {rel: _coalesced(writes) for rel, writes in self.pending.items()}
        for rel, writes in self.pending.items():
            path = self.root / rel
            size = path.stat().st_size
            with open(path, "rb") as fh:
                for offset, data in sorted(writes.items()):
                    old = read_exact(fh, max(0, min(len(data), size - offset)), offset) if offset < size else b""
                    at = None
                    if any(old):
                        at = self._blob.seek(0, os.SEEK_END)
                        with named(self.backup / PREIMAGES):
                            self._blob.write(old)
                    self.ranges.setdefault(rel, []).append([offset, len(old), at])
                    self._log({"range": rel, "offset": offset, "length": len(old), "at": at})
        self._sync_journal()
        fault_point()
        for rel, writes in self.pending.items():
            with named(self.root / rel), open(self.root / rel, "r+b") as fh:
                for offset, data in sorted(writes.items()):
                    fh.seek(offset)
                    fh.write(data)
                    fault_point()
        self.pending, self.pending_bytes = {}, 0

    @staticmethod
    def _truncate(path: Path, size: int) -> None:
        with named(path), open(path, "ab") as fh:
            fh.truncate(size)

    # -- the end ----------------------------------------------------------------------------------------
    def commit(self) -> Path | None:
        """Apply what is pending, make it durable, record the backup; returns the backup directory. The
        commit point is the backup's manifest.json (renamed in): an error before it undoes the change, an
        error after it says the change stands."""
        if self.empty:
            return None
        manifest = self.backup / "manifest.json"
        try:
            self.flush()
            for rel in self.sizes:
                _fsync_file(self.root / rel)
            for parent in {(self.root / rel).parent for rel in self.sizes}:
                fsync_dir(parent)
            fault_point()
            staged = self._stage_manifest()
            with named(manifest):
                os.replace(staged, manifest)
        except BaseException:
            _best_effort(self.rollback)   # what stays, the next command undoes
            raise
        self._close()
        try:
            fsync_dir(self.backup)
            with named(self.root / JOURNAL):
                (self.root / JOURNAL).unlink()
            fsync_dir(self.root)
        except OSError as exc:
            state = store_state(self.root) if pending_journal(self.root) else \
                _unflushed(f"the change is applied (backup in {self.backup})")
            raise failed(exc, state) from None
        fault_point()
        return self.backup

    def rollback(self) -> None:
        """Undo everything written so far (after an error in the middle of the change)."""
        self.pending, self.pending_bytes = {}, 0
        if self._blob is None:
            return
        try:
            self._sync_journal()
        finally:
            self._close()
        if pending_journal(self.root):
            complete_pending(self.root)
        if not (self.backup / "manifest.json").exists():      # no partial backup stays either
            _remove(self.backup if self._made_backup else self.backup / PREIMAGES)

    def _close(self) -> None:
        for fh in (self._journal, self._blob):
            if fh is not None:
                fh.close()
        self._journal = self._blob = None

    def _stage_manifest(self) -> Path:
        entries = [{"path": rel, "kind": "ranges", "size": None if size < 0 else size,
                    "ranges": self.ranges.get(rel, [])} for rel, size in sorted(self.sizes.items())]
        entries += [{"path": d, "kind": "created_dir"} for d in self.dirs]
        entries += [{"path": rel, "kind": "removed", "kept": str(Path("removed") / rel)} for rel in self.removed]
        self._blob.flush()
        manifest = {"store": str(self.root.resolve()), "label": self.label,
                    "created": clock.system_now().astimezone(dt.timezone.utc).isoformat(), "preimages": PREIMAGES,
                    "preimages_sha256": _sha256(self.backup / PREIMAGES), "entries": entries}
        staged = self.backup / ("manifest.json" + STAGED)
        _write_synced(staged, json.dumps(manifest, indent=1).encode())
        return staged


def _steps(lines: list[str]) -> list[dict]:
    """The journal's steps; a torn last line is dropped (nothing it describes was written yet)."""
    steps = []
    for i, line in enumerate(lines):
        try:
            steps.append(json.loads(line))
        except ValueError:
            if i + 1 < len(lines):
                raise
    return steps


def _coalesced(writes: dict[int, bytes]) -> dict[int, bytes]:
    """Writes that continue one another joined into one (a later write over an earlier one wins)."""
    out: dict[int, bytearray] = {}
    start = end = None
    for offset, data in sorted(writes.items()):
        if start is not None and offset <= end:
            chunk = out[start]
            chunk[offset - start:offset - start + len(data)] = data
            end = max(end, offset + len(data))
        else:
            start, end = offset, offset + len(data)
            out[start] = bytearray(data)
    return {k: bytes(v) for k, v in out.items()}


def _undo(root: Path, steps: list[dict], backup: Path) -> None:
    """Roll a journalled in-place change back: each range gets its old bytes, each file its old size
    (or goes), each directory created goes; repeatable, so a crash during the undo is undone again."""
    blob = backup / PREIMAGES
    with open(blob, "rb") if blob.exists() else contextlib.nullcontext() as pre:
        for step in reversed(steps):
            if "range" in step:
                path = root / step["range"]
                if not path.exists() or not step["length"]:
                    continue
                if step["at"] is not None and pre is None:
                    raise UnsafeWrite("the pre-images an interrupted change needs to be undone are missing "
                                      "(was its backup removed?)", path=str(blob))
                old = bytes(step["length"]) if step["at"] is None else read_exact(pre, step["length"], step["at"])
                with named(path), open(path, "r+b") as fh:
                    fh.seek(step["offset"])
                    fh.write(old)
                    os.fsync(fh.fileno())
            elif "file" in step:
                path = root / step["file"]
                if step["size"] < 0:
                    path.unlink(missing_ok=True)
                elif path.exists():
                    with named(path), open(path, "r+b") as fh:
                        fh.truncate(step["size"])
                        os.fsync(fh.fileno())
                if path.parent.exists():
                    fsync_dir(path.parent)
            elif "moved" in step:
                path, kept = root / step["moved"], Path(step["to"])
                if kept.exists() and not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(kept, path)
                    fsync_dir(path.parent)
            elif "mkdir" in step:
                path = root / step["mkdir"]
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
                    fsync_dir(path.parent)


def _restore_ranges(manifest: dict, backup: Path, root: Path, undo: Path) -> Path | None:
    """Restore an in-place change: every range gets its pre-image back (in reverse order, so the oldest
    bytes win), every file its old size; files the change created go; as one PatchTransaction."""
    txn = PatchTransaction(root, undo, label="restore")
    try:
        for entry in manifest["entries"]:
            rel, target = entry["path"], confined(root, entry["path"])
            if entry["kind"] == "removed" and not target.exists() and (backup / entry["kept"]).is_file():
                _put_back(txn, rel, backup / entry["kept"])
            if entry["kind"] != "ranges" or not target.exists():
                continue
            if entry["size"] is None:
                txn.remove(rel)
                continue
            for r in reversed(entry["ranges"]):
                txn.write_at(rel, r[0], _preimage(r, backup))
                txn.flush()                          # one range at a time: the last write wins
            if target.stat().st_size != entry["size"]:
                txn.resize(rel, entry["size"])
        for entry in reversed(manifest["entries"]):
            path = confined(root, entry["path"])
            if entry["kind"] == "created_dir" and path.is_dir() and not any(path.iterdir()):
                txn.remove(entry["path"])
        return txn.commit()
    except BaseException:
        txn.rollback()
        raise


def _put_back(txn: PatchTransaction, rel: str, kept: Path) -> None:
    """A removed file created again from its backup copy, its data regions only (holes stay holes)."""
    with open(kept, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        txn.create(rel, size)
        for lo, hi in data_extents(fh.fileno(), 0, size):
            for pos in range(lo, hi, 1 << 20):
                txn.write_at(rel, pos, read_exact(fh, min(1 << 20, hi - pos), pos))
