"""Whole-federation checkpoints as an incremental chain: written so that a crash never leaves the run
without a good one, read without ever running code from the file, and costing what changed, not N.

A checkpoint is a chain of links: a *base* holds the whole federation; each later *delta* holds what
changed since the link before it (the server state and counters, the clients touched since then, the
clients removed, the history rows appended). Resume reads the newest link and walks back to the base;
for every client the newest version wins. The loop writes a new base when the deltas written since
the last one add up to the base's size (or after ``max_links`` links), so a round's checkpoint costs
about twice the bytes of what that round changed, amortised, whatever the number of clients.

Files in the run directory:

- ``checkpoint.pt``: the newest link; ``checkpoint.prev.pt``: the link before it (the fallback).
- ``checkpoint.chain/<id>.pt``: older links still needed by one of those two; ``<id>.<map>.<k>.pt``:
  segments of a link whose entries did not fit one file (``segment_bytes``: a base of 1 000 large
  client states is streamed out segment by segment, never held in memory at once).

Saving: every file goes to a temp name (created new, never through a link: ``pfl.safe_files``), is
fsynced and loaded back (``weights_only``, memory mapped, so no second copy in memory) before it is
renamed into place. Every file (link or segment) records the SHA-256 of its content (``_sha256``:
the tree's structure, numbers, strings and tensor bytes), computed from what was saved. Segments
are placed first, then the link before the newest becomes ``checkpoint.prev.pt`` and the new link
``checkpoint.pt``; the directories are fsynced, and files no longer reachable from either are
deleted. A kill at any point leaves at least one complete, verified chain.

Loading: ``torch.load(..., weights_only=True)`` admits tensors, numbers, strings and containers
only; a file that needs any other global is refused (UnsafeCheckpoint), never unpickled. Memory-mapped
loading skips the zip checksums, so every file's content is hashed again and compared with the
SHA-256 it records before it is used. Names in the chain metadata become paths only in the exact form
``save`` writes (``LINK_ID``, ``SEGMENT_NAME``: never absolute, never ``..``), inside the chain folder.
A truncated, empty, altered or unsafe newest link (or one whose chain is incomplete or altered, or
whose metadata has another form) is reported in one line and the previous one is used; so is one
that records no SHA-256 (its key damaged, or written by an earlier version of pfl), which is used
only when no chain verifies. A file without chain metadata (written by ``save_checkpoint``, or by
earlier versions of pfl) is a base on its own.

A full disk while saving is one ConfigError line naming the file; the temp file is removed and the
checkpoints already in place are untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.serialization import get_unsafe_globals_in_checkpoint

from pfl import numeric_platform
from pfl.errors import ConfigError
from pfl.federation.distributed import move
from pfl.federation.progress import RunProgress
from pfl.federation.store import ClientStore, detached_copy, tree_bytes, tree_map
from pfl.safe_files import ensure_folder, new_file

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
PENDING = "checkpoint.pt.tmp"
CHAIN_DIR = "checkpoint.chain"
META = "_chain"
DIGEST = "_sha256"  # the SHA-256 of the rest of the file's content, recorded when it was written
SEGMENT_BYTES = 64 * 2**20  # map entries beyond this go to separate files, written one at a time
CHECKPOINT_COST_RATIO = 20.0  # with checkpoint_every > 1: checkpoint once this many times its cost has passed
MAX_LINKS = 200  # a new base after this many links at the latest (bounds the files resume opens)
SETTINGS = "settings"  # the run's settings, recorded in every link (compared with config.yaml on resume)
PLATFORM = "platform"  # where the run computed its numbers, recorded in every link (compared on resume)
# The names pfl gives chain files (``CheckpointChain.save``): a link id is the round (9 digits or more)
# and 8 random hex digits; a segment is ``<link id>.<map name>.<k>.pt``. A name read from a file becomes a
# path only when it has exactly this form, so it cannot leave the chain folder (``/``, ``..``, absolute).
LINK_ID = re.compile(r"\d{9,19}-[0-9a-f]{8}")
SEGMENT_NAME = re.compile(r"(\d{9,19}-[0-9a-f]{8})\.[A-Za-z_]{1,64}\.\d{1,9}\.pt")


class UnreadableCheckpoint(Exception):
    """The file is damaged (truncated, empty, not a torch archive, altered, or with metadata pfl never
    writes); an older one may still serve."""


class UnsafeCheckpoint(UnreadableCheckpoint):
    """The file needs globals other than tensors and containers: refused, never unpickled (a damaged
    type name reads the same way, so an older checkpoint may still serve)."""


def _unsafe_globals(path: Path) -> list[str]:
    try:
        return list(get_unsafe_globals_in_checkpoint(path))
    except Exception:  # an archive too damaged to list is unreadable, which the caller reports
        return []


def content_digest(tree: Any) -> str:
    """SHA-256 of a checkpoint tree: its structure (dict keys in order, list vs tuple), every
    number and string (with its type), and every tensor's dtype, shape and bytes."""
    sha = hashlib.sha256()

    def visit(node: Any) -> None:
        if isinstance(node, Tensor):
            flat = node.detach().cpu().contiguous().reshape(-1)
            sha.update(f"T{node.dtype}{tuple(node.shape)};".encode())
            sha.update(flat.view(torch.uint8).numpy())
        elif isinstance(node, dict):
            sha.update(b"{")
            for key, value in node.items():
                visit(key)
                visit(value)
            sha.update(b"}")
        elif isinstance(node, (list, tuple)):
            sha.update(b"[" if isinstance(node, list) else b"(")
            for value in node:
                visit(value)
            sha.update(b"]")
        else:
            sha.update(f"{type(node).__name__}:{node!r};".encode())

    visit(tree)
    return sha.hexdigest()


def read_checkpoint(path: Path, mmap: bool = False, verify: bool = True) -> dict[str, Any]:
    """Load one checkpoint file with ``weights_only=True``. A file that needs other globals raises
    UnsafeCheckpoint naming them; a damaged file, or one whose content differs from the SHA-256 it
    records (``verify``), raises UnreadableCheckpoint. A file that records no SHA-256 is returned
    unverified (``CheckpointChain.load`` uses such a file only when no checkpoint verifies)."""
    return _read(path, mmap, verify)[0]


def _read(path: Path, mmap: bool, verify: bool) -> tuple[dict[str, Any], bool]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # torch reports damage and refusal with many types; sort them below
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise UnsafeCheckpoint(
                f"it holds objects that are not plain tensors/containers: {', '.join(unsafe)}; "
                "pfl refuses to unpickle code"
            ) from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnreadableCheckpoint(reason) from None
    if not isinstance(state, dict):
        raise UnreadableCheckpoint(f"it holds a {type(state).__name__}, not a checkpoint dict")
    recorded = state.pop(DIGEST, None)
    if verify and recorded is not None and recorded != content_digest(state):
        raise UnreadableCheckpoint("its content differs from the SHA-256 recorded when it was written")
    return state, recorded is not None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_verified(payload: dict[str, Any], pending: Path, run_dir: Path) -> tuple[int, float]:
    """torch.save ``payload`` with its SHA-256 to ``pending`` (a new file, never through a link),
    fsync, and load it back; returns the file's size and the seconds spent hashing."""
    started = time.perf_counter()
    payload = {**payload, DIGEST: content_digest(payload)}
    hashing = time.perf_counter() - started
    fix = f"free space there, then continue with --resume {run_dir}; its last checkpoints are intact"
    with new_file(pending, fsync=True, full_fix=fix) as fh:
        torch.save(payload, fh)
    try:
        read_checkpoint(pending, mmap=True, verify=False)  # the digest was computed from this payload
    except (ConfigError, UnreadableCheckpoint) as err:  # a bug in what pfl saves, not bad input
        pending.unlink(missing_ok=True)
        raise RuntimeError(
            f"the checkpoint just written does not load back with weights_only=True ({err}); "
            "checkpoints must hold only tensors, Python numbers, strings and containers (e.g. float() numpy scalars)"
        ) from None
    return pending.stat().st_size, hashing


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as a complete checkpoint on its own (no chain); the newest one becomes the
    previous one. Every guarantee of the module holds."""
    path, previous, pending = run_dir / CHECKPOINT, run_dir / PREVIOUS, run_dir / PENDING
    _write_verified(payload, pending, run_dir)
    if path.exists():
        os.replace(path, previous)
    os.replace(pending, path)
    _fsync_dir(run_dir)
    return path


# -- chains -----------------------------------------------------------------------------------------
@dataclass
class MapDelta:
    """A keyed collection's change in one link: ``entries`` (key, value) set since the previous link
    (all of them in a base; streamed, so a generator keeps memory flat), ``removed`` keys."""

    entries: Iterable[tuple[int, Any]] = ()
    removed: Iterable[int] = ()


@dataclass
class ListDelta:
    """An append-only list's change: ``items`` from position ``start`` on."""

    start: int
    items: list[Any]


@dataclass
class _Link:
    """A link as the chain knows it: where its file is, its parent, and its files in the chain folder."""

    id: str
    parent: str | None
    depth: int  # links since the base (0 for a base)
    base_bytes: int  # size of this chain's base
    delta_bytes: int  # size of the deltas since the base, this one included
    segments: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, meta: dict[str, Any]) -> _Link:
        segments = [s for m in meta.get("maps", {}).values() for s in m.get("segments", [])]
        return cls(meta["id"], meta.get("parent"), meta["depth"], meta["base_bytes"], meta["delta_bytes"], segments)


def chain_file(chain_dir: Path, name: str) -> Path:
    """``chain_dir / name`` for a name of the form pfl writes there (``<link id>.pt`` or a segment);
    any other name (absolute, with ``/`` or ``..``) is UnreadableCheckpoint, never a path."""
    if not (SEGMENT_NAME.fullmatch(name) or (name.endswith(".pt") and LINK_ID.fullmatch(name[:-3]))):
        raise UnreadableCheckpoint(f"it names the chain file {name!r}, which pfl never writes")
    return chain_dir / name


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_meta(meta: Any) -> None:
    """UnreadableCheckpoint unless ``meta`` has exactly the form ``CheckpointChain.save`` writes: ids
    and segment names that name files inside the chain folder, counts that are counts."""

    def bad(what: str) -> UnreadableCheckpoint:
        return UnreadableCheckpoint(f"its chain metadata ({META}) {what}, which pfl never writes")

    if not isinstance(meta, dict):
        raise bad(f"is a {type(meta).__name__}")
    link_id, parent = meta.get("id"), meta.get("parent")
    if not (isinstance(link_id, str) and LINK_ID.fullmatch(link_id)):
        raise bad(f"has the id {link_id!r}")
    if parent is not None and not (isinstance(parent, str) and LINK_ID.fullmatch(parent)):
        raise bad(f"has the parent id {parent!r}")
    for key in ("depth", "base_bytes", "delta_bytes"):
        if not _count(meta.get(key)):
            raise bad(f"has {key} {meta.get(key)!r}")
    maps, lists = meta.get("maps", {}), meta.get("lists", {})
    if not (isinstance(maps, dict) and isinstance(lists, dict)):
        raise bad("has maps or lists that are not dicts")
    for name, entry in maps.items():
        if not (isinstance(name, str) and isinstance(entry, dict)):
            raise bad(f"has the map {name!r}")
        segments, removed = entry.get("segments", []), entry.get("removed", [])
        if not (isinstance(segments, list) and isinstance(removed, list) and all(_count(k) for k in removed)):
            raise bad(f"has the map {name!r} with segments or removed keys of another form")
        for segment in segments:
            match = SEGMENT_NAME.fullmatch(segment) if isinstance(segment, str) else None
            if match is None or match.group(1) != link_id:
                raise bad(f"names the segment {segment!r}")
    for name, start in lists.items():
        if not (isinstance(name, str) and _count(start)):
            raise bad(f"has the list {name!r} starting at {start!r}")


class Checkpoint:
    """A resolved chain, newest link first: merged values and lists, map entries streamed on demand."""

    def __init__(self, links: list[tuple[Path, dict[str, Any]]], chain_dir: Path):
        self.links = links  # (file, its content loaded memory-mapped), newest first
        self.chain_dir = chain_dir

    @property
    def meta(self) -> dict[str, Any] | None:
        return self.links[0][1].get(META)

    def _maps(self) -> set[str]:
        return {name for _, link in self.links for name in link.get(META, {}).get("maps", {})}

    def _lists(self) -> set[str]:
        return {name for _, link in self.links for name in link.get(META, {}).get("lists", {})}

    @property
    def values(self) -> dict[str, Any]:
        """Every value key, from the newest link that has it."""
        skip = self._maps() | self._lists() | {META}
        out: dict[str, Any] = {}
        for _, link in self.links:
            for key, value in link.items():
                if key not in skip and key not in out:
                    out[key] = value
        return out

    def list(self, name: str) -> list[Any]:
        """An append-only list, rebuilt from the base up."""
        out: list[Any] = []
        for _, link in reversed(self.links):
            if name in link.get(META, {}).get("lists", {}):
                start = link[META]["lists"][name]
                out = out[:start] + list(link.get(name, []))
            elif name in link:
                out = list(link[name])
        return out

    def map_keys(self, name: str) -> list[int]:
        return [k for k, _ in self._map_entries(name, load=False)]

    def map_items(self, name: str) -> Iterator[tuple[int, Any]]:
        """(key, value) of a keyed collection, the newest version of each key, in key order per link;
        values are copies (never memory-mapped file pages), read one segment at a time."""
        for key, value in self._map_entries(name, load=True):
            yield key, detached_copy(value, "cpu")

    def _map_entries(self, name: str, load: bool) -> Iterator[tuple[int, Any]]:
        seen: set[int] = set()
        for _, link in self.links:
            if META in link and name not in link[META].get("maps", {}):
                continue  # this link did not write the map
            meta = link.get(META, {}).get("maps", {}).get(name)
            if meta is None:  # a file without chain metadata: a complete map, if it has one
                for key, value in sorted(link.get(name, {}).items()):
                    if key not in seen:
                        seen.add(key)
                        yield key, value
                return
            seen.update(meta.get("removed", []))
            parts: list[Any] = [link.get(name, {})]
            parts += [chain_file(self.chain_dir, s) for s in meta.get("segments", [])]
            for part in parts:
                entries = read_checkpoint(part, mmap=True, verify=False) if isinstance(part, Path) else part
                for key, value in sorted(entries.items()):
                    if key not in seen:
                        seen.add(key)
                        yield key, value
            if meta.get("full"):
                return

    def materialize(self) -> dict[str, Any]:
        """The whole checkpoint as one dict (values, lists, maps): for small federations and tools."""
        out = dict(self.values)
        for name in self._lists():
            out[name] = self.list(name)
        for name in self._maps():
            out[name] = dict(self.map_items(name))
        return out


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


class CheckpointChain:
    """Writes and reads the incremental chain of ``run_dir``; the next link extends the last one
    written or loaded."""

    def __init__(self, run_dir: Path, segment_bytes: int = SEGMENT_BYTES, max_links: int = MAX_LINKS):
        self.run_dir = Path(run_dir)
        self.chain_dir = self.run_dir / CHAIN_DIR
        self.segment_bytes = segment_bytes
        self.max_links = max_links
        self.head: _Link | None = None  # the link at checkpoint.pt (or prev, after a fallback)
        self._head_at: Path | None = None
        self._lineage: dict[str, _Link] = {}  # every link the head and its fallback need
        self._previous: _Link | None = None  # the link at checkpoint.prev.pt when known
        self.last_bytes = 0
        self.last_seconds = 0.0
        self.last_hash_seconds = 0.0  # of last_seconds, the time spent computing SHA-256 digests
        self._collector: threading.Thread | None = None

    # -- policy -----------------------------------------------------------------------------------
    def due_for_base(self) -> bool:
        """True when the next link should be a base: none yet, the deltas since the base add up to
        its size, or the chain has ``max_links`` links."""
        h = self.head
        return h is None or h.delta_bytes >= h.base_bytes or h.depth + 1 >= self.max_links

    # -- saving -----------------------------------------------------------------------------------
    def save(
        self,
        values: dict[str, Any],
        maps: dict[str, MapDelta] | None = None,
        lists: dict[str, ListDelta] | None = None,
        base: bool = False,
    ) -> Path:
        """Write one link: a base (``base=True``, or when nothing precedes it: ``maps`` then hold
        every entry and ``lists`` start at 0) or a delta on the current head."""
        started = time.perf_counter()
        self.last_hash_seconds = 0.0
        maps, lists = maps or {}, lists or {}
        parent = None if base else self.head
        if parent is None:
            for name, delta in lists.items():
                if delta.start != 0:
                    raise ValueError(f"a base needs the whole list {name!r} (got it from position {delta.start})")
        ensure_folder(self.chain_dir)  # a link here would make the collection below delete elsewhere
        link_id = f"{int(values.get('round', 0)):09d}-{secrets.token_hex(4)}"
        payload: dict[str, Any] = dict(values)
        meta: dict[str, Any] = {"version": 2, "id": link_id, "parent": parent.id if parent else None}
        meta["maps"], meta["lists"] = {}, {}
        size = 0
        for name, delta in maps.items():
            inline, segments, written = self._stream(link_id, name, delta.entries)
            payload[name] = inline
            meta["maps"][name] = {"removed": sorted(int(k) for k in delta.removed), "segments": segments}
            meta["maps"][name]["full"] = parent is None
            size += written
        for name, delta in lists.items():
            payload[name] = list(delta.items)
            meta["lists"][name] = int(delta.start)
        pending = self.run_dir / PENDING
        # The compaction policy compares tensor bytes (file overheads left out): segments + link.
        estimate = size + tree_bytes(payload)
        meta["depth"] = parent.depth + 1 if parent else 0
        meta["base_bytes"] = parent.base_bytes if parent else estimate
        meta["delta_bytes"] = parent.delta_bytes + estimate if parent else 0
        payload[META] = meta
        self._write(tree_map(lambda t: t.detach().cpu(), payload), pending)
        link = _Link.of(meta)
        self._commit(link, pending)
        self.last_bytes = estimate
        self.last_seconds = time.perf_counter() - started
        return self.run_dir / CHECKPOINT

    def _stream(self, link_id: str, name: str, entries: Iterable[tuple[int, Any]]) -> tuple[dict, list[str], int]:
        """Map entries into segment files of at most ``segment_bytes`` each (a segment is written as
        soon as it is full); what is left stays inline in the link file. Returns (inline entries,
        segment names, tensor bytes in the segments)."""
        buffer: dict[int, Any] = {}
        held, written, segments = 0, 0, []
        for key, value in entries:
            value = tree_map(lambda t: t.detach().cpu(), value)
            nbytes = tree_bytes(value)
            if buffer and held + nbytes > self.segment_bytes:
                segments.append(f"{link_id}.{name}.{len(segments)}.pt")
                self._place(buffer, self.chain_dir / segments[-1])
                written += held
                buffer, held = {}, 0
            buffer[int(key)] = value
            held += nbytes
        return buffer, segments, written

    def _write(self, payload: dict[str, Any], pending: Path) -> None:
        self.last_hash_seconds += _write_verified(payload, pending, self.run_dir)[1]

    def _place(self, payload: dict[str, Any], path: Path) -> None:
        pending = path.with_name(path.name + ".tmp")
        self._write(payload, pending)
        os.replace(pending, path)
        _fsync_dir(path.parent)

    def _commit(self, link: _Link, pending: Path) -> None:
        """Make ``link`` the newest and the link it follows the fallback; then drop unreachable files.

        Each step leaves a readable chain behind: the old fallback moves into the chain folder (when
        still needed) before the current newest link takes its place, and only then does the new
        link become ``checkpoint.pt``."""
        path, previous = self.run_dir / CHECKPOINT, self.run_dir / PREVIOUS
        fallback = self.head
        if self._head_at == previous:  # resumed from the fallback: checkpoint.pt is damaged
            path.unlink(missing_ok=True)
        else:
            if previous.exists():
                old = self._previous
                if old is not None and fallback is not None and old.id in self._ancestry(fallback):
                    os.replace(previous, chain_file(self.chain_dir, f"{old.id}.pt"))
                else:  # not needed any more: deleted with the other unreachable files, off this thread
                    os.replace(previous, self.chain_dir / f"unused-{secrets.token_hex(4)}.pt")
            if path.exists():
                os.replace(path, previous)
        os.replace(pending, path)
        # One directory fsync makes the renames durable: journaling filesystems commit the renames
        # into the chain folder (earlier, in the same journal) with it. Segments were synced already.
        _fsync_dir(self.run_dir)
        self._lineage[link.id] = link
        self._previous = fallback
        self.head, self._head_at = link, path
        self._collect()

    def _ancestry(self, link: _Link | None) -> list[str]:
        ids = []
        while link is not None:
            ids.append(link.id)
            link = self._lineage.get(link.parent) if link.parent else None
        return ids

    def _collect(self) -> None:
        """Delete chain files that neither the newest link nor its fallback needs. The deletions run
        in a background thread (an unlink costs a few ms on some filesystems, and nothing waits for
        it); files left by a process that exits first are collected by the next save."""
        needed = set(self._ancestry(self.head)) | set(self._ancestry(self._previous))
        self._lineage = {k: v for k, v in self._lineage.items() if k in needed}
        keep = {f"{i}.pt" for i in needed} | {s for i in needed for s in self._lineage[i].segments}
        doomed = [f for f in self.chain_dir.iterdir() if f.name not in keep]
        if self._collector is not None:
            self._collector.join()
        self._collector = threading.Thread(target=_unlink_all, args=(doomed,), daemon=True)
        self._collector.start()

    def wait(self) -> None:
        """Until the background deletions are done."""
        if self._collector is not None:
            self._collector.join()
            self._collector = None

    # -- loading ----------------------------------------------------------------------------------
    def load(self, check: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """The newest verified chain (``checkpoint.pt``'s, else ``checkpoint.prev.pt``'s), or None when
        the run has none; the next saved link extends it. ``check`` may refuse a chain's content
        (UnreadableCheckpoint). A damaged, altered, unsafe or refused file (or one whose chain is
        incomplete) is reported in one line on stderr and skipped; so is a chain with a file that
        records no SHA-256, used only when no chain verifies. When none is usable, a ConfigError
        lists them."""
        candidates = [p for p in (self.run_dir / CHECKPOINT, self.run_dir / PREVIOUS) if p.exists()]
        if not candidates:
            return None
        found: dict[Path, dict[str, Any]] = {}
        verified: dict[Path, bool] = {}
        errors: dict[Path, str] = {}
        for path in candidates:
            try:
                found[path], verified[path] = self._read_link(path)
            except UnreadableCheckpoint as err:
                errors[path] = str(err)
        damaged, unverified = [], None
        for k, path in enumerate(candidates):
            state = "unreadable"
            if path not in errors:
                try:
                    links, ok = self._resolve(path, found, verified)
                    checkpoint = Checkpoint(links, self.chain_dir)
                    if check is not None:
                        check(checkpoint)
                except UnreadableCheckpoint as err:
                    errors[path] = str(err)
                else:
                    if ok:
                        self._adopt(path, links, found)
                        return checkpoint
                    state, errors[path] = "unverified", f"it or its chain records no SHA-256 ({DIGEST})"
                    unverified = unverified or (path, links, checkpoint)
            damaged.append(f"{path} ({errors[path]})")
            then = f"falling back to {candidates[k + 1]}" if k + 1 < len(candidates) else "no older checkpoint"
            print(f"warning: checkpoint {path} is {state} ({errors[path]}); {then}", file=sys.stderr)
        if unverified is not None:  # written by an earlier version of pfl: better than nothing
            path, links, checkpoint = unverified
            print(f"warning: no checkpoint of {self.run_dir} verifies; using {path} unverified", file=sys.stderr)
            self._adopt(path, links, found)
            return checkpoint
        raise ConfigError(
            "--resume",
            f"no readable checkpoint in {self.run_dir}: {'; '.join(damaged)}",
            "start a new run; the damaged files cannot be resumed",
        )

    @staticmethod
    def _read_link(path: Path) -> tuple[dict[str, Any], bool]:
        """A link file (memory-mapped, its SHA-256 checked when it records one) and whether it does;
        chain metadata of another form than pfl writes is UnreadableCheckpoint."""
        content, verified = _read(path, mmap=True, verify=True)
        if META in content:
            check_meta(content[META])
        return content, verified

    def _resolve(
        self, path: Path, found: dict[Path, dict[str, Any]], verified: dict[Path, bool]
    ) -> tuple[list[tuple[Path, dict[str, Any]]], bool]:
        """The chain from the link at ``path`` back to its base, and whether every file of it (links
        and segments) verified against its SHA-256. A writer may move a link into the chain folder
        while this reads, so a missing parent is looked for again a few times."""
        links = [(path, found[path])]
        all_verified = verified[path]
        while (parent := links[-1][1].get(META, {}).get("parent")) is not None:
            for attempt in range(5):
                where = [p for p, content in found.items() if content.get(META, {}).get("id") == parent]
                where.append(chain_file(self.chain_dir, f"{parent}.pt"))
                target = next((p for p in where if p.exists()), None)
                if target is not None:
                    try:
                        content, ok = (found[target], verified[target]) if target in found else self._read_link(target)
                    except UnreadableCheckpoint as err:
                        raise UnreadableCheckpoint(f"its chain link {target} is unreadable: {err}") from None
                    if content.get(META, {}).get("id") == parent:
                        links.append((target, content))
                        all_verified = all_verified and ok
                        break
                time.sleep(0.05 * (attempt + 1))
            else:
                raise UnreadableCheckpoint(f"its chain link {parent} is missing")
        for _, content in links:  # segments are read later, while restoring: verify them now
            for name in {s for m in content.get(META, {}).get("maps", {}).values() for s in m.get("segments", [])}:
                segment = chain_file(self.chain_dir, name)
                try:
                    all_verified = _read(segment, mmap=True, verify=True)[1] and all_verified
                except UnreadableCheckpoint as err:
                    raise UnreadableCheckpoint(f"its segment {segment} is unreadable: {err}") from None
        return links, all_verified

    def _adopt(self, path: Path, links: list[tuple[Path, dict[str, Any]]], found: dict[Path, dict[str, Any]]) -> None:
        """Continue the chain from the link just loaded (a file without chain metadata: the next
        link is a base, and that file becomes its fallback)."""
        self._lineage, self._previous, self._head_at = {}, None, path
        metas = [content.get(META) for _, content in links]
        if any(m is None for m in metas):
            self.head = None
            return
        for meta in metas:
            link = _Link.of(meta)
            self._lineage[link.id] = link
        self.head = _Link.of(metas[0])
        meta = found.get(self.run_dir / PREVIOUS, {}).get(META) if path.name == CHECKPOINT else None
        if meta is not None and meta["id"] in self._lineage:
            self._previous = self._lineage[meta["id"]]


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """The settings the newest readable checkpoint of ``run_dir`` records (``Checkpointer.settings``),
    read from that one link file (verified when it records its SHA-256); None when no link records
    them (a run of an earlier version of pfl, or damaged files, which the resume itself reports)."""
    for path in (run_dir / CHECKPOINT, run_dir / PREVIOUS):
        try:
            settings = read_checkpoint(path, mmap=True).get(SETTINGS) if path.exists() else None
        except UnreadableCheckpoint:
            continue
        if isinstance(settings, dict):
            return settings
    return None


def other_platform(recorded: object, current: dict[str, Any]) -> str | None:
    """What to say when a checkpoint written on the ``recorded`` platform is resumed on ``current``
    (None: the same one, or a checkpoint of an earlier version of pfl, which recorded none)."""
    if not isinstance(recorded, dict) or recorded == current:
        return None
    return (
        f"this run's checkpoint was written on {numeric_platform.label(recorded)} and the run continues on "
        f"{numeric_platform.label(current)}: its rounds from here can differ from those of a run never stopped "
        '(docs/reproduce.md, "Same numbers")'
    )


def check_values(checkpoint: Checkpoint) -> None:
    """UnreadableCheckpoint unless ``checkpoint`` holds what a run is restored from, of the types pfl
    writes: ``round`` and ``train_samples`` counts, ``train_seconds`` a number, a ``server`` state, all
    in the newest link itself (pfl writes them into every link)."""
    values = checkpoint.links[0][1]
    missing = [key for key in ("round", "server", "train_samples", "train_seconds") if key not in values]
    if missing:
        raise UnreadableCheckpoint(f"it has no {', '.join(missing)}, which every checkpoint pfl writes has")
    for key in ("round", "train_samples"):
        if not _count(values[key]):
            raise UnreadableCheckpoint(f"its {key} is {values[key]!r}, not a count (0 or more)")
    seconds = values["train_seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise UnreadableCheckpoint(f"its train_seconds is {seconds!r}, not a number")


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint of ``run_dir`` as one dict (a chain merged), or None when the
    run has none. A damaged file is reported in one line on stderr and skipped."""
    checkpoint = CheckpointChain(run_dir).load()
    return None if checkpoint is None else checkpoint.materialize()


@dataclass(frozen=True)
class RunState:
    """The stateful parts of a run a checkpoint holds, by name: its progress (round, history, client
    rows, counters), the server (its state), the client store, and the evaluation session (counters,
    rows, trained models); ``device`` is where restored tensors go."""

    progress: RunProgress
    server: Any  # pfl.methods.base.ServerContext
    clients: ClientStore
    evals: Any  # pfl.metrics.session.EvalSession
    device: torch.device


class Checkpointer:
    """When a run checkpoints, what each link of its chain holds, and how a run is restored from one.

    A link holds what changed since the last one (server state, counters, the clients trained or
    removed, new history rows, the client rows after an evaluation), or everything when the chain
    is due for a base (``CheckpointChain``)."""

    def __init__(
        self,
        checkpoint_every: int = 1,
        run_dir: Path | None = None,
        settings: dict[str, Any] | None = None,
        chain: CheckpointChain | None = None,
        state: RunState | None = None,
    ):
        """``settings``: what the run was configured with (plain values), recorded in every link so that
        a resume can tell an edited config.yaml before building anything (``recorded_settings``; None:
        not recorded). ``chain``: the chain a resume read from ``run_dir``, which the next link extends.
        ``state``: the parts saved and restored (None: a checkpointer that only keeps the schedule)."""
        self.checkpoint_every = checkpoint_every
        self.chain: CheckpointChain | None = None
        if chain is not None and run_dir is not None and chain.run_dir == Path(run_dir):
            self.chain = chain
        self.run_dir = run_dir
        self.state = state
        self.settings = settings
        self.seconds = 0.0  # total time spent checkpointing (time.checkpoint_s)
        self._history_saved = 0  # history rows already in the chain
        # The client rows in the chain: an evaluation replaces the list, so another object is news.
        self._rows_saved = None if state is None else state.progress.client_rows
        self._saved_round, self._saved_at, self.save_cost = 0, time.perf_counter(), None

    @property
    def run_dir(self) -> Path | None:
        return self._run_dir

    @run_dir.setter
    def run_dir(self, path: Path | str | None) -> None:
        """Where checkpoints go (None: nowhere). A chain already read from that folder is kept."""
        self._run_dir = None if path is None else Path(path)
        if self._run_dir is None:
            self.chain = None
        elif self.chain is None or self.chain.run_dir != self._run_dir:
            self.chain = CheckpointChain(self._run_dir)

    def due(self, round_number: int) -> bool:
        """After a round: ``trainer.checkpoint_every`` rounds since the last checkpoint (at most that
        many are lost to a kill), or earlier once the time since it is ``CHECKPOINT_COST_RATIO`` times
        what it cost, so checkpoints take at most ~1/20 of the run while the rounds allow."""
        if round_number - self._saved_round >= self.checkpoint_every or self.save_cost is None:
            return True
        return time.perf_counter() - self._saved_at >= CHECKPOINT_COST_RATIO * self.save_cost

    def _parts(self) -> RunState:
        if self.state is None:
            raise RuntimeError("this Checkpointer was given no run state to save or restore")
        return self.state

    def values(self) -> dict[str, Any]:
        run = self._parts()
        progress = run.progress
        values = {
            "round": progress.round,
            "server": run.server.state,
            "train_samples": progress.train_samples,
            "train_seconds": progress.train_seconds,
            "evals": run.evals.state_dict(),
        }
        if self.settings is not None:
            values[SETTINGS] = self.settings
        values[PLATFORM] = numeric_platform.record(run.device)
        return values

    def state_dict(self) -> dict[str, Any]:
        """The whole run state as one dict (what ``load_checkpoint`` returns for a run)."""
        run = self._parts()
        return {
            **self.values(),
            "clients": dict(run.clients.items()),
            "trained": dict(run.evals.trained.items()),
            "history": run.progress.history,
            "client_rows": run.progress.client_rows,
            "eval_rows": run.evals.rows,
        }

    def save(self) -> None:
        """Write one link of the checkpoint chain."""
        assert self.chain is not None
        run = self._parts()
        started = time.perf_counter()
        base = self.chain.due_for_base()
        maps = {}
        for name, store in (("clients", run.clients), ("trained", run.evals.trained)):
            changed, removed = store.changes()
            ids = list(store) if base else changed
            maps[name] = MapDelta(_entries(store, ids), () if base else removed)
        history = run.progress.history
        start = 0 if base else self._history_saved
        values = self.values()
        rows = run.progress.client_rows
        if base or rows is not self._rows_saved:
            values["client_rows"], values["eval_rows"] = rows, run.evals.rows
        self.chain.save(values, maps, {"history": ListDelta(start, history[start:])}, base=base)
        run.clients.clear_changes()
        run.evals.trained.clear_changes()
        self._history_saved, self._rows_saved = len(history), rows
        self._saved_at = time.perf_counter()
        self.save_cost, self._saved_round = self._saved_at - started, run.progress.round
        self.seconds += self.save_cost

    def resume(self, run_dir: Path) -> bool:
        """Restore the newest readable checkpoint of ``run_dir`` (False when it has none); later
        checkpoints extend its chain."""
        run_dir = Path(run_dir)
        chain = self.chain if self.chain is not None and self.chain.run_dir == run_dir else CheckpointChain(run_dir)
        if self.run_dir is None:
            self.chain = chain  # kept when the run folder is set to run_dir later (see run_dir)
        checkpoint = chain.load(check=check_values)
        if checkpoint is None:
            return False
        self.restore(checkpoint)
        return True

    def restore(self, checkpoint: Checkpoint) -> None:
        """Restore a resolved checkpoint chain, streaming the client states into the stores."""
        history = checkpoint.list("history")
        items = checkpoint.map_items("clients"), checkpoint.map_items("trained")
        self._restore(checkpoint.values, history, *items)
        note = other_platform(checkpoint.values.get(PLATFORM), numeric_platform.record(self._parts().device))
        if note is not None:
            print(f"warning: {note}", file=sys.stderr)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (or a checkpoint of an earlier version, whose evaluation state
        held the trained models and rows)."""
        self._restore(state, state["history"], state["clients"].items(), state.get("trained", {}).items())

    def _restore(self, values: dict[str, Any], history: list, clients: Any, trained: Any) -> None:
        run = self._parts()
        device = run.device
        run.progress.load_state_dict({**values, "history": history})
        run.server.round = run.progress.round
        run.server.state = move(values["server"], device)
        evals = values.get("evals", {})
        if evals:
            run.evals.load_state_dict(evals, device)
        if "eval_rows" in values:
            run.evals.rows = values["eval_rows"]
        if "trained" in evals:  # a checkpoint of an earlier version: trained models in the evaluation state
            trained = evals["trained"].items()
        for store, items in ((run.clients, clients), (run.evals.trained, trained)):
            store.clear()
            for cid, state in items:  # one at a time: a disk store spills beyond its budget
                store[cid] = move(state, device)
            store.clear_changes()
        self._history_saved, self._rows_saved = len(run.progress.history), run.progress.client_rows


def _entries(store: ClientStore, ids: list[int]) -> Iterator[tuple[int, Any]]:
    """(id, state) of the given clients, read one at a time (a disk store never loads them all)."""
    for cid in ids:
        yield cid, store.peek(cid)


__all__ = [
    "CHAIN_DIR",
    "CHECKPOINT",
    "PREVIOUS",
    "RunState",
    "Checkpoint",
    "CheckpointChain",
    "Checkpointer",
    "ListDelta",
    "MapDelta",
    "UnreadableCheckpoint",
    "UnsafeCheckpoint",
    "chain_file",
    "check_meta",
    "check_values",
    "content_digest",
    "recorded_settings",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
]
