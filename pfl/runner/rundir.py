"""Who owns a run directory: one process at a time, and never a finished run's folder by accident.

- A new run refuses a folder that already holds anything (a finished, failed or running run),
  unless ``tracking.overwrite`` is true: the old folder is then moved to
  ``<root>/_replaced/<name>-<timestamp>/`` (never deleted), and only once the new run has been
  validated and built. An automatic name (no ``tracking.name``) takes the next free ``-2``, ``-3``, ...
- While a process owns a run it holds an exclusive ``flock`` on ``<run>/run.lock`` (which records
  its pid, host and start time); a second process is refused with that owner named. The kernel
  drops the lock when the process exits, however it exits, so a killed run never leaves a stale
  lock. ``flock`` is advisory and local: runs on network file systems without lock support are not
  protected against each other across machines.
- Multi-process runs: only rank 0 claims the folder and writes into it.
- A folder that will be written into must hold no symbolic link where pfl writes
  (``pfl.safe_files.refuse_links``); the lock file is opened without following links.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from pfl.errors import ConfigError
from pfl.safe_files import ensure_folder, open_lock, refuse_links, remove

LOCK = "run.lock"
REPLACED = "_replaced"


def read_owner(run_dir: Path) -> str:
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a planted link is never read
    except OSError:
        text = ""
    else:
        with os.fdopen(fd) as fh:
            text = fh.read(4096).strip()
    return text or "another process (not yet recorded)"


def busy_owner(run_dir: Path) -> str | None:
    """The owner recorded in ``run.lock`` when a live process holds the lock, else None."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_owner(run_dir)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def has_results(run_dir: Path) -> bool:
    """Whether the folder holds anything but the lock file (an empty one, or one left by a set-up
    that failed before writing anything, can be reused)."""
    return run_dir.is_dir() and any(p.name != LOCK for p in run_dir.iterdir())


def check_writable(run_dir: Path) -> None:
    """A resumed run writes into its folder: refused in one line when this user cannot."""
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError("--resume", f"{run_dir} is not writable by this user", "copy the run somewhere writable")


def check_creatable(path: Path, field: str = "tracking.root") -> None:
    """``path`` exists as a writable folder, or can be created: every existing component is a folder
    and the deepest existing one is writable (``field``: the option that named it)."""
    option = field if field.startswith("-") else f"--{field}"
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise ConfigError(field, f"{path} cannot be created: {probe} is a dangling symbolic link")
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    if not probe.is_dir():
        raise ConfigError(
            field,
            f"{path} cannot be created: {probe} is a file, not a folder",
            f"choose another {option}, or move that file away",
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            field,
            f"{path} cannot be written: {probe} is not writable by this user",
            f"choose a writable {option}",
        )


def refuse_existing(run_dir: Path) -> ConfigError:
    finished = (run_dir / "summary.json").exists()
    what = "a finished run" if finished else "the files of an earlier run"
    return ConfigError(
        "tracking.name",
        f"run folder {run_dir} already exists and holds {what}",
        f"continue it with --resume {run_dir}, replace it with --tracking.overwrite true (the old folder is "
        f"moved under <tracking.root>/{REPLACED}/), or choose another --tracking.name",
    )


def refuse_busy(run_dir: Path, owner: str, field: str) -> ConfigError:
    return ConfigError(
        field,
        f"run folder {run_dir} is in use by {owner}",
        "wait for that run to finish or stop it"
        + (", or choose another --tracking.name" if field != "--resume" else ""),
    )


def precheck(run_dir: Path, *, resume: bool, overwrite: bool, auto_name: bool) -> None:
    """The cheap checks made before anything is built (``RunClaim`` repeats them under the lock).
    A folder pfl will write into must hold no symbolic link where pfl writes (``refuse_links``); a
    resume checks that it may write only once it knows the run is not finished already (a finished
    run on read-only storage still shows its results)."""
    field = "--resume" if resume else "tracking.name"
    owner = busy_owner(run_dir)
    if owner is not None and not auto_name:
        raise refuse_busy(run_dir, owner, field)
    if resume:
        refuse_links(run_dir, field)
        return
    check_creatable(run_dir)
    if has_results(run_dir) and not (overwrite or auto_name):
        raise refuse_existing(run_dir)
    if not has_results(run_dir):  # reused as it is (a folder with results is moved aside or skipped)
        refuse_links(run_dir, field)


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``<run_dir>/run.lock``, recording the owner."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        fd = open_lock(self.run_dir / LOCK, create=True)  # a link there is refused, never truncated
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        owner = f"pid {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _aside(run_dir: Path, root: Path) -> Path:
    """A free ``<root>/_replaced/<name>-<timestamp>[-k]`` for the folder being replaced."""
    name = os.path.relpath(run_dir, root)
    base = root / REPLACED / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    target, k = base, 1
    while target.exists():
        k += 1
        target = base.with_name(f"{base.name}-{k}")
    return target


class RunClaim:
    """Own a run folder for the duration of a ``with`` block.

    Entering creates the folder if needed and locks it; an existing folder with results is refused,
    moved aside (``overwrite``), or skipped for the next free name (``auto_name``). A resume locks
    the existing folder. Leaving releases the lock; when the block failed and the claim had created
    the folder, which holds nothing but the lock file, the folder is removed again (no stray run)
    and an overwritten folder is moved back.
    """

    def __init__(
        self, run_dir: Path, root: Path, *, resume: bool = False, overwrite: bool = False, auto_name: bool = False
    ):
        self.requested, self.root = run_dir, root
        self.resume, self.overwrite, self.auto_name = resume, overwrite, auto_name
        self.dir = run_dir
        self.replaced: Path | None = None  # where an overwritten folder went
        self._lock: RunLock | None = None
        self._created = False

    def __enter__(self) -> RunClaim:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release(failed=exc_type is not None)

    def acquire(self) -> RunClaim:
        if self.resume:
            lock = RunLock(self.dir)
            if not lock.try_acquire():
                raise refuse_busy(self.dir, read_owner(self.dir), "--resume")
            self._lock = lock
            return self
        for k in range(1, 1000 if self.auto_name else 2):
            candidate = self.requested if k == 1 else self.requested.with_name(f"{self.requested.name}-{k}")
            if self._claim(candidate):
                return self
        raise ConfigError("tracking.name", f"no free run folder next to {self.requested}", "give --tracking.name")

    def _claim(self, run_dir: Path) -> bool:
        existed = run_dir.exists()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            check_creatable(run_dir)  # names the offending component when it can
            raise ConfigError("tracking.root", f"cannot create {run_dir}: {err.strerror}") from None
        lock = RunLock(run_dir)
        if not lock.try_acquire():
            if self.auto_name:
                return False
            raise refuse_busy(run_dir, read_owner(run_dir), "tracking.name")
        if has_results(run_dir):
            if self.auto_name:
                lock.release()
                return False
            if not self.overwrite:
                lock.release()
                raise refuse_existing(run_dir)
            # We hold the old folder's lock, so no process is using it: move it aside, whole.
            aside = _aside(run_dir, self.root)
            try:  # a link there would move the old run out of the root
                ensure_folder(self.root / REPLACED)
                ensure_folder(aside.parent)
            except ConfigError:
                lock.release()
                raise
            os.rename(run_dir, aside)
            lock.release()
            self.replaced = aside
            return self._claim(run_dir)
        self.dir, self._lock, self._created = run_dir, lock, not existed
        return True

    def release(self, failed: bool = False) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if failed and self._created and not has_results(self.dir):
            remove(self.dir / LOCK)
            with contextlib.suppress(OSError):
                self.dir.rmdir()  # empty now; never a tree removed through a link
            if self.replaced is not None and not self.dir.exists():
                os.rename(self.replaced, self.dir)  # nothing replaced it: the old run goes back
                self.replaced = None
