"""Client stores: the loop's per-client state (``loop.clients``) as a ``MutableMapping[int, State]``.

A method sees one client's state as a plain dict of tensors (``ClientContext.state``); the store
decides where the states of all clients live between rounds:

- ``MemoryStore`` (``trainer.client_store: memory``): every state stays on the training device.
- ``DiskStore`` (``trainer.client_store: disk``): at most ``trainer.store_budget_mb`` of states stay
  on the training device, least recently used first out; the others are spilled to one file per
  client (``torch.save`` of CPU tensors, read back with ``weights_only=True`` onto the device).

Both track which clients changed since the last ``clear_changes()`` (set, replaced, removed, or
marked by the loop as trained this round), so that checkpoints write only those
(``pfl.federation.checkpoint``).

Contract (the same one multi-process rounds rely on): a client's state changes only while that
client trains. Values handed out by ``store[cid]`` may be changed in place; values read with
``peek`` or by iterating (``items()``, ``values()``) must be treated as read-only: on the disk store
an in-place change to them is not written back.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pfl.safe_files import ensure_folder, new_file, remove, remove_tree

STORES = ("memory", "disk")


def tree_map(fn: Any, tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every tensor inside dicts, lists and tuples."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v) for v in tree)
    return tree


def tree_bytes(tree: Any) -> int:
    """Bytes held by the tensors of ``tree`` (each storage counted once: views do not add)."""
    seen: set[int] = set()
    total = 0

    def visit(t: Any) -> None:
        nonlocal total
        if isinstance(t, Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(t, dict):
            for v in t.values():
                visit(v)
        elif isinstance(t, (list, tuple)):
            for v in t:
                visit(v)

    visit(tree)
    return total


def tree_equal(a: Any, b: Any) -> bool:
    """Same structure, same keys, bit-identical tensors (same dtype, shape and bytes)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(tree_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(tree_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _bits(t: Tensor) -> Tensor:
    """The tensor's bytes (NaN equals the same NaN, -0.0 differs from 0.0)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def detached_copy(tree: Any, device: torch.device | str) -> Any:
    """A copy of ``tree`` on ``device`` that shares no storage with it (a spilled state must not
    keep a view of a larger tensor alive, nor be changed through one)."""
    return tree_map(lambda t: t.detach().to(device, copy=True), tree)


def _peek(mapping: Any, key: int) -> Any:
    return mapping.peek(key) if isinstance(mapping, ClientStore) else mapping[key]


class ClientStore(MutableMapping[int, Any]):
    """Change tracking shared by every store. Iteration is in client-id order, so it does not depend
    on the order in which clients were visited."""

    kind = ""

    def __init__(self) -> None:
        self._changed: set[int] = set()
        self._removed: set[int] = set()
        self.pinned: set[int] = set()  # in use: never evicted (see ``pin``)

    @contextmanager
    def pin(self, cids: Iterable[int]) -> Iterator[None]:
        """Keep these clients' states on the device while the block runs (e.g. while their trained
        states are still being filled in by vectorized training)."""
        before = set(self.pinned)
        self.pinned |= {int(c) for c in cids}
        try:
            yield
        finally:
            self.pinned = before
            self._unpinned()

    def _unpinned(self) -> None:
        """Back within budget once the pinned states may go (nothing to do in memory)."""

    # -- change tracking (for incremental checkpoints) ---------------------------------------------
    def mark_changed(self, cids: Iterable[int]) -> None:
        """Record that these clients' states may have changed in place (the loop marks every client
        it trained this round)."""
        for cid in cids:
            if cid in self:
                self._changed.add(int(cid))
                self._removed.discard(int(cid))

    def changes(self) -> tuple[list[int], list[int]]:
        """(clients changed, clients removed) since the last ``clear_changes()``, each sorted."""
        changed = sorted(c for c in self._changed if c in self)
        removed = sorted(c for c in self._removed if c not in self)
        return changed, removed

    def clear_changes(self) -> None:
        """Called once the changes are safely in a checkpoint."""
        self._changed, self._removed = set(), set()

    def _note_set(self, cid: int) -> None:
        self._changed.add(cid)
        self._removed.discard(cid)

    def _note_removed(self, cid: int) -> None:
        self._changed.discard(cid)
        self._removed.add(cid)

    # -- reading without taking ownership -----------------------------------------------------------
    def peek(self, cid: int, default: Any = None) -> Any:
        """The value of ``cid`` for reading only (``default`` when absent)."""
        return self.get(cid, default)

    def items(self) -> Iterator[tuple[int, Any]]:  # type: ignore[override]
        for cid in list(self):
            yield cid, self.peek(cid)

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        for cid in list(self):
            yield self.peek(cid)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (dict, ClientStore)):
            return NotImplemented
        return set(self) == set(other) and all(tree_equal(self.peek(k), _peek(other, k)) for k in self)

    __hash__ = None  # type: ignore[assignment] - mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} clients)"

    # -- footprint ------------------------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Bytes of the states held on the training device now."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the store holds outside memory (nothing for the memory store)."""


class MemoryStore(ClientStore):
    """Every client's state in a dict on the training device."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[int, Any] = {}

    def __getitem__(self, cid: int) -> Any:
        return self._data[cid]

    def __setitem__(self, cid: int, value: Any) -> None:
        self._data[int(cid)] = value
        self._note_set(int(cid))

    def __delitem__(self, cid: int) -> None:
        del self._data[cid]
        self._note_removed(int(cid))

    def __contains__(self, cid: object) -> bool:
        return cid in self._data

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def resident_bytes(self) -> int:
        return sum(tree_bytes(v) for v in self._data.values())


class DiskStore(ClientStore):
    """States on the training device up to ``budget_bytes``; the least recently used beyond that are
    written to ``folder/<cid>.pt`` and read back (``weights_only=True``) when next used.

    A state handed out by ``store[cid]`` counts as changed (the caller may change it in place) and is
    written when it is evicted; one read with ``peek`` that is still on disk is loaded without
    displacing anything (it is not kept). Sizes of handed-out states are re-measured before every
    eviction decision, so a state that grew in place is accounted for. The store may exceed its
    budget by one state (the one in use), never by more.
    """

    kind = "disk"

    def __init__(self, budget_bytes: int, device: torch.device | str = "cpu", folder: Path | str | None = None):
        super().__init__()
        if budget_bytes < 0:
            raise ValueError(f"a store budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = int(budget_bytes)
        self.device = torch.device(device)
        self._own_folder = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="pfl-store-")) if folder is None else Path(folder)
        ensure_folder(self.folder)  # a link here would make the clean-up below delete elsewhere
        for stale in self.folder.glob("*.pt"):  # spill files of an earlier process are never reused
            remove(stale)
        self._resident: OrderedDict[int, Any] = OrderedDict()  # least recently used first
        self._sizes: dict[int, int] = {}
        self._clean: set[int] = set()  # resident states identical to their spill file
        self._stale: set[int] = set()  # handed out since their size was last measured
        self._spilled: set[int] = set()  # on disk only
        self.reads = 0
        self.writes = 0
        self._cleanup = weakref.finalize(self, _remove_spill, self.folder, self._own_folder)

    def _path(self, cid: int) -> Path:
        return self.folder / f"{cid}.pt"

    # -- the mapping --------------------------------------------------------------------------------
    def __getitem__(self, cid: int) -> Any:
        if cid in self._resident:
            self._resident.move_to_end(cid)
        elif cid in self._spilled:
            self._admit(cid, self._read(cid), clean=True)
        else:
            raise KeyError(cid)
        self._clean.discard(cid)  # handed out: may be changed in place
        self._stale.add(cid)
        return self._resident[cid]

    def __setitem__(self, cid: int, value: Any) -> None:
        cid = int(cid)
        if cid in self._spilled:
            self._spilled.discard(cid)
            self._path(cid).unlink(missing_ok=True)
        self._resident.pop(cid, None)
        self._clean.discard(cid)
        self._admit(cid, value, clean=False)
        self._stale.add(cid)
        self._note_set(cid)

    def __delitem__(self, cid: int) -> None:
        if cid in self._resident:
            del self._resident[cid]
            self._sizes.pop(cid, None)
            self._clean.discard(cid)
            self._stale.discard(cid)
            self._path(cid).unlink(missing_ok=True)
        elif cid in self._spilled:
            self._spilled.discard(cid)
            self._path(cid).unlink(missing_ok=True)
        else:
            raise KeyError(cid)
        self._note_removed(int(cid))

    def __contains__(self, cid: object) -> bool:
        return cid in self._resident or cid in self._spilled

    def __iter__(self) -> Iterator[int]:
        return iter(sorted([*self._resident, *self._spilled]))

    def __len__(self) -> int:
        return len(self._resident) + len(self._spilled)

    def peek(self, cid: int, default: Any = None) -> Any:
        if cid in self._resident:
            return self._resident[cid]
        if cid in self._spilled:
            return self._read(cid)
        return default

    # -- residency --------------------------------------------------------------------------------
    @property
    def resident(self) -> list[int]:
        """Clients whose state is on the training device, least recently used first."""
        return list(self._resident)

    @property
    def spilled(self) -> list[int]:
        return sorted(self._spilled)

    def resident_bytes(self) -> int:
        self._measure()
        return sum(self._sizes[c] for c in self._resident)

    def _measure(self) -> None:
        for cid in self._stale:
            if cid in self._resident:
                self._sizes[cid] = tree_bytes(self._resident[cid])
        self._stale.clear()

    def _admit(self, cid: int, value: Any, clean: bool) -> None:
        self._resident[cid] = value
        self._sizes[cid] = tree_bytes(value)
        self._spilled.discard(cid)
        if clean:
            self._clean.add(cid)
        self._evict(keep=cid)

    def _unpinned(self) -> None:
        self._evict(keep=None)

    def _evict(self, keep: int | None) -> None:
        self._measure()
        total = sum(self._sizes[c] for c in self._resident)
        for cid in list(self._resident):
            if total <= self.budget:
                break
            if cid == keep or cid in self.pinned:
                continue
            value = self._resident.pop(cid)
            if cid not in self._clean:
                self._write(cid, value)
            total -= self._sizes.pop(cid)
            self._clean.discard(cid)
            self._spilled.add(cid)

    def _write(self, cid: int, value: Any) -> None:
        path, pending = self._path(cid), self._path(cid).with_suffix(".pt.tmp")
        with new_file(pending) as fh:
            torch.save(detached_copy(value, "cpu"), fh)
        os.replace(pending, path)
        self.writes += 1

    def _read(self, cid: int) -> Any:
        self.reads += 1
        return torch.load(self._path(cid), map_location=self.device, weights_only=True)

    def close(self) -> None:
        """Delete the spill files (and the folder when the store made it). Also runs when the store
        is garbage collected or the interpreter exits; only a killed process leaves files behind,
        which the next store in the same folder deletes."""
        self._cleanup()


def _remove_spill(folder: Path, own: bool) -> None:
    if own:
        with contextlib.suppress(OSError):  # at exit: nothing left to report to
            remove_tree(folder)
        return
    for path in folder.glob("*.pt*"):
        remove(path)


def make_store(kind: str, budget_mb: float, device: torch.device | str, folder: Path | None = None) -> ClientStore:
    """The store ``trainer.client_store`` names (``folder``: where a disk store spills; a temporary
    folder when None)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "disk":
        return DiskStore(int(budget_mb * 2**20), device, folder)
    raise ValueError(f"unknown client store {kind!r}; choose one of {', '.join(STORES)}")


__all__ = [
    "STORES",
    "ClientStore",
    "DiskStore",
    "MemoryStore",
    "detached_copy",
    "make_store",
    "tree_bytes",
    "tree_equal",
    "tree_map",
]
