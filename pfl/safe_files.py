"""Files pfl creates, replaces and deletes inside a run folder, never through a symbolic link.

A run folder may come from elsewhere (copied from a cluster, unpacked from an archive), so a name
pfl writes there may be a planted link: writing ``config.yaml.tmp`` through a link to a shell rc
file would put the config text there, deleting ``checkpoint.chain/*`` through a link to another
folder would empty that folder. Every write, replace and delete under a run folder goes through this
module:

- a new file (always a temporary one, renamed over its destination afterwards) is created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``: it cannot be a link, nor an existing file;
- a rename replaces the directory entry, a link included, and never writes through it;
- a delete checks the entry with ``lstat`` first: a link is removed itself, its target never;
  ``shutil.rmtree`` never runs on a link;
- a folder pfl fills (``checkpoint.chain``, W&B's ``wandb``, spill folders) must be a real folder.

``refuse_links`` finds planted links before a run starts (one ConfigError line naming the link). A
disk that fills up while a file is written is reported in one line naming the file; the temporary
file is removed and the destination keeps its old content.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pfl.errors import ConfigError

# Folders inside a run folder that pfl fills itself: links anywhere below them are refused too.
# (``wandb`` is W&B's: it makes its own ``latest-run`` link there; only the folder itself is checked.)
MANAGED_FOLDERS = ("checkpoint.chain", "client_store")
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
LINK_FIX = "remove the link (or put a copy of the file it points to in its place) and run again"


def link_error(path: Path, field: str = "tracking.root") -> ConfigError:
    """The one-line refusal of a link where pfl writes."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return ConfigError(
        field,
        f"{path} is a symbolic link (to {target}); pfl never writes, replaces or deletes through a link "
        "inside a run folder",
        LINK_FIX,
    )


def find_links(folder: Path) -> list[Path]:
    """Links directly inside ``folder`` and anywhere below its ``MANAGED_FOLDERS`` (never followed)."""
    found: list[Path] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if entry.is_symlink():
            found.append(Path(entry.path))
        elif entry.name in MANAGED_FOLDERS and entry.is_dir(follow_symlinks=False):
            for parent, dirs, files in os.walk(entry.path):  # os.walk does not descend into links
                found += [Path(parent, n) for n in sorted(dirs + files) if os.path.islink(os.path.join(parent, n))]
    return found


def refuse_links(folder: Path, field: str = "tracking.root") -> None:
    """ConfigError naming the first link where pfl writes in the run folder ``folder`` (the folder
    itself may be a link: that is where the user chose to keep the run)."""
    links = find_links(folder)
    if links:
        raise link_error(links[0], field)


def ensure_folder(path: Path) -> Path:
    """``path`` as a real folder (created with its parents when missing); a link is refused."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise link_error(path) if path.is_symlink() else NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))
    return path


def remove(path: Path) -> None:
    """Delete the file ``path`` (a link: the link itself); nothing when it is missing."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # unlink never follows a link


def remove_tree(path: Path) -> None:
    """Delete ``path`` and, when it is a real folder, everything below it; a link is removed itself
    (``shutil.rmtree`` never runs on a link, and does not follow the links it meets inside)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from, e.g. torch's after a failed write) is a full
    disk or an exhausted quota."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in FULL_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def full_disk_error(path: Path, fix: str) -> ConfigError:
    return ConfigError("tracking.root", f"no space left on the device while writing {path}", fix)


def create_new(path: Path) -> BinaryIO:
    """``path`` opened for writing as a new file: a stale regular file there (left by a killed
    writer) is removed first; a link is refused, never followed. ``O_EXCL``: if anything appears
    at ``path`` in between, this fails instead of writing into it."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(mode):
            raise link_error(path)
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "wb")


@contextmanager
def new_file(
    path: Path, fsync: bool = False, full_fix: str = "free space on that device and run again"
) -> Iterator[BinaryIO]:
    """Write the new file ``path`` (see ``create_new``); on any failure it is removed again, and a
    full disk becomes one ConfigError line naming ``path`` and ``full_fix``."""
    try:
        fh = create_new(path)
    except OSError as err:
        if disk_full(err):
            raise full_disk_error(path, full_fix) from None
        raise
    try:
        with fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
    except BaseException as err:
        remove(path)
        if disk_full(err):
            raise full_disk_error(path, full_fix) from None
        raise


def write_atomic(path: Path, content: bytes | str | Callable[[BinaryIO], object], fsync: bool = False) -> None:
    """Replace ``path`` whole: ``content`` (bytes, text, or a function writing to the open file)
    goes to ``<path>.tmp``, which is then renamed over ``path``; a kill or a full disk never leaves
    a partial ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with new_file(tmp, fsync=fsync) as fh:
        if callable(content):
            content(fh)
        else:
            fh.write(content.encode() if isinstance(content, str) else content)
    os.replace(tmp, path)


def hard_link_error(path: Path, links: int, field: str = "tracking.root") -> ConfigError:
    """The one-line refusal of a file with other names (a hard link) where pfl writes in place."""
    return ConfigError(
        field,
        f"{path} is a hard link ({links} names for one file); pfl never writes in place into a file that "
        "has other names, which may lie outside the run folder",
        "delete it (pfl makes a new one) and run again",
    )


def open_lock(path: Path, create: bool) -> int:
    """A descriptor of the lock file ``path`` (read-write, created when ``create``), never through
    a link: a symbolic link is refused, and so is a file that is not a regular file or has other
    names (a hard link, whose other name may be outside the run folder: the owner record written
    into the lock would land there); FileNotFoundError when it is missing and not created."""
    # O_NONBLOCK: a FIFO planted there never blocks the open (no effect on a regular file)
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("tracking.root", f"{path} is not a regular file", "delete it and run again")
        raise hard_link_error(path, st.st_nlink)
    return fd


__all__ = [
    "MANAGED_FOLDERS",
    "create_new",
    "disk_full",
    "ensure_folder",
    "find_links",
    "hard_link_error",
    "link_error",
    "new_file",
    "open_lock",
    "refuse_links",
    "remove",
    "remove_tree",
    "write_atomic",
]
