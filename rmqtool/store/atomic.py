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

import datetime as dt
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

from rmqtool.errors import UnsafeWrite
from rmqtool.store.filequeue import data_extents

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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write(path: Path, data: bytes) -> None:
    """Replace one file: temp file beside it, fsync, rename, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + STAGED)
    _write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_backup_dir(root: Path) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
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

    def write(self, rel: str, data: bytes) -> None:
        self.writes[rel] = data

    def delete(self, rel: str) -> None:
        if (self.root / rel).exists() and rel not in self.deletes:
            self.deletes.append(rel)

    def replace_dir(self, rel: str, built: Path) -> None:
        """Swap in ``built`` (a directory on the same file system) as ``rel``."""
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
        self._backup(backup)
        ops: list[list[str]] = []
        for rel, data in self.writes.items():
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_synced(target.with_name(target.name + STAGED), data)
            fault_point()
            ops.append(["replace", rel + STAGED, rel])
        for rel, built in self.dirs.items():
            staged = self.root / (rel + STAGED)
            if staged.exists():
                shutil.rmtree(staged)
            staged.parent.mkdir(parents=True, exist_ok=True)
            _fsync_tree(built)
            os.rename(built, staged)
            fault_point()
            ops.append(["swapdir", rel + STAGED, rel])
        ops += [["delete", rel] for rel in self.deletes]
        for parent in {(self.root / op[-1]).parent for op in ops}:
            if parent.exists():
                fsync_dir(parent)
        journal = {"label": self.label, "backup": str(backup), "ops": ops}
        _write_synced(self.root / (JOURNAL + STAGED), json.dumps(journal).encode())
        os.replace(self.root / (JOURNAL + STAGED), self.root / JOURNAL)
        fsync_dir(self.root)
        fault_point()
        _roll_forward(self.root, ops)
        return backup

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
                with open(dst, "rb") as fh:
                    os.fsync(fh.fileno())
                entries.append({"path": rel, "kind": "file", "sha256": _sha256(dst)})
            else:
                entries.append({"path": rel, "kind": "absent"})
        manifest = {"store": str(self.root.resolve()), "label": self.label,
                    "created": dt.datetime.now(dt.timezone.utc).isoformat(), "entries": entries}
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
    with open(src, "rb") as fin, open(dst, "wb") as fout:
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
            with open(os.path.join(d, f), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(d))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _roll_forward(root: Path, ops: list[list[str]]) -> None:
    """Apply journal operations; each one is idempotent, so a repeated run finishes the job."""
    for op in ops:
        if op[0] == "replace":
            src, dst = root / op[1], root / op[2]
            if src.exists():
                os.replace(src, dst)
                fsync_dir(dst.parent)
        elif op[0] == "swapdir":
            src, dst = root / op[1], root / op[2]
            old = dst.with_name(dst.name + OLD)
            if src.exists():
                if dst.exists():
                    if old.exists():
                        shutil.rmtree(old)
                    os.rename(dst, old)
                    fault_point()
                os.rename(src, dst)
                fsync_dir(dst.parent)
            if old.exists():
                shutil.rmtree(old)
        elif op[0] == "delete":
            path = root / op[1]
            if path.exists():
                _remove(path)
                fsync_dir(path.parent)
        fault_point()
    (root / JOURNAL).unlink(missing_ok=True)
    fsync_dir(root)


def pending_journal(root: Path) -> Path | None:
    path = Path(root) / JOURNAL
    return path if path.exists() else None


def complete_pending(root: Path) -> bool:
    """Finish an interrupted commit (journal present) or drop staged leftovers of one that never
    reached its commit point. Returns True when anything was done."""
    root = Path(root)
    journal = root / JOURNAL
    if journal.exists():
        try:
            ops = json.loads(journal.read_text("utf-8"))["ops"]
        except (ValueError, KeyError) as exc:
            raise UnsafeWrite(f"unreadable journal of an interrupted change: {exc}", path=str(journal)) from None
        _roll_forward(root, ops)
        return True
    leftovers = [p for p in _walk(root) if p.name.endswith((STAGED, OLD, BUILD))]
    for p in leftovers:
        _remove(p)
    return bool(leftovers)


def _walk(root: Path):
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(d) / name


def read_backup(backup: Path) -> dict:
    """A backup's manifest, every file checked against its recorded SHA-256 (UnsafeWrite when one
    is missing or differs: such a backup is not put back)."""
    backup = Path(backup)
    try:
        manifest = json.loads((backup / "manifest.json").read_text("utf-8"))
        entries = manifest["entries"]
    except FileNotFoundError:
        raise UnsafeWrite("not an rmqtool backup (no manifest.json)", path=str(backup)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UnsafeWrite(f"unreadable backup manifest: {exc}", path=str(backup / "manifest.json")) from None
    for entry in entries:
        path = backup / entry["path"]
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
        target = Path(root) / rel
        if kind == "file":
            if not target.is_file() or _sha256(target) != entry["sha256"]:
                rows.append({"action": "restore_file", "path": rel, "detail": "put back the backed-up file"})
        elif kind == "dir":
            if not target.is_dir() or _tree_digest(target) != _tree_digest(Path(backup) / rel):
                rows.append({"action": "restore_dir", "path": rel, "detail": "put back the backed-up directory"})
        elif target.exists():
            rows.append({"action": "delete", "path": rel, "detail": "absent before the change"})
    return rows


def _tree_digest(path: Path) -> list[tuple[str, str]]:
    return sorted((str(p.relative_to(path)), _sha256(p) if p.is_file() else "dir") for p in _walk(path))


def undo_dir(backup: Path) -> Path:
    """Where restoring ``backup`` keeps the state it replaces (so that a restore can be undone too)."""
    backup = Path(backup)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return backup.with_name(f"{backup.name}.undo-{stamp}")


def restore_backup(backup: Path, root: Path, undo: Path | None = None) -> Path | None:
    """Put every path of a backup back as it was (files absent before the change are removed), in one
    transaction whose own backup (``undo``, default beside ``backup``) holds the state replaced.
    Returns that backup (None when the store already matched)."""
    backup = Path(backup)
    manifest = read_backup(backup)
    txn = Transaction(Path(root), undo or undo_dir(backup), label="restore")
    for entry in manifest["entries"]:
        rel = entry["path"]
        if entry["kind"] == "file":
            txn.write(rel, (backup / rel).read_bytes())
        elif entry["kind"] == "dir":
            built = Path(root) / (rel + BUILD)
            _remove(built)
            shutil.copytree(backup / rel, built, copy_function=copy_sparse)   # new inodes
            txn.replace_dir(rel, built)
        else:
            txn.delete(rel)
    return txn.commit()
