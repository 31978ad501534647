"""A data constructor's reads: routed by the routing table to the source-loader slots
(one call per slot for all the units built together) and moved to a slot's standby
when its serving actor is lost or stalls (:class:`ReadRouter`)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from ._calls import actor_lost, unwrap
from ._routing import KEY_SHIFT, RoutingTable, key_index


class ReadRouter:
    """The reads of data constructor ``index``: which slot serves each document (the
    routing table in use, as compact key arrays), which actor of each slot serves now,
    and the reads in flight per table version, so that a new table is in force once the
    reads of the older ones have drained.

    Args:
        index: the constructor's index (named in errors).
        namespace: the deployment's Ray namespace.
        read_timeout: seconds a read may take before it moves to the slot's next actor.
        slot_names: per slot, its actor's name then its standbys' (launch's; the
            planner's table replaces them at set-up).
    """

    def __init__(self, index: int, namespace: str, read_timeout: float,
                 slot_names: Sequence[Any]) -> None:
        self._index = int(index)
        self._namespace = namespace
        self._read_timeout = float(read_timeout)
        #: per slot: the primary's name, then its standbys' (shadows)
        self.slot_names = [[n] if isinstance(n, str) else list(n) for n in slot_names]
        self._handles: Dict[str, Any] = {}
        self._slots: List[List[Any]] = []  # per slot: its actors' handles
        self._active: List[int] = []  # per slot: which of its actors serves
        self._pstart = np.zeros(0, dtype=np.int64)
        self._powner = np.zeros(0, dtype=np.int64)
        #: the routing version in force
        self.version = 0
        self._inflight: Dict[int, int] = {}  # reads in flight by routing version
        self._drain = asyncio.Condition()
        #: the last moves of reads to another actor of their slot: {"slot", "from",
        #: "to", "reason", "time"}
        self.failovers: Any = collections.deque(maxlen=1000)

    def apply(self, version: int, routing, slot_names) -> None:
        """Route reads by ``routing`` (per source: partition starts, slot per
        partition); ``slot_names[slot]``: the slot's actor, then its standbys.  Slots
        are only ever appended, so a read in flight keeps a valid slot index."""
        self.slot_names = [[n] if isinstance(n, str) else list(n) for n in slot_names]
        # handles of slots that serve (a retired slot has no names: no lookups)
        old_active = self._active
        self._slots = []
        for names in self.slot_names:
            hs = []
            for n in names:
                if n not in self._handles:
                    self._handles[n] = ray.get_actor(n, namespace=self._namespace)
                hs.append(self._handles[n])
            self._slots.append(hs)
        # which candidate of each slot serves
        self._active = [old_active[j] if j < len(old_active) else 0
                        for j in range(len(self._slots))]
        self._pstart, self._powner = key_index(routing)
        self.version = int(version)

    def apply_table(self, table: RoutingTable) -> None:
        """Route by ``table`` when it is newer than the one in force."""
        if int(table.version) > self.version:
            self.apply(int(table.version), *table.for_constructors())

    def handles(self) -> List[Any]:
        """Every source-loader actor this router has a handle of."""
        return list(self._handles.values())

    async def drained(self) -> None:
        """Return once no read routed by a table older than the one in force is in
        flight."""
        async with self._drain:
            while any(n for v, n in self._inflight.items() if v < self.version):
                await self._drain.wait()

    async def read(self, reads: np.ndarray) -> Tuple[List[Any], np.ndarray, np.ndarray,
                                                     np.ndarray]:
        """Read the rows of ``reads`` (int64 ``[n, 4]``: source, index, offset, count),
        one call per slot: ``(outs, order, starts, ends)``, ``outs[j]`` the answer
        (uint8) of the slot of rows ``order[starts[j]:ends[j]]``.

        Raises:
            PolyloadIOError: no actor of a slot could read (naming them).
            PolyloadError: a source loader's error (a bad document, ...).
        """
        n = len(reads)
        key = reads[:, 0] << KEY_SHIFT | reads[:, 1]
        owner = self._powner[np.searchsorted(self._pstart, key, side="right") - 1]
        order = np.argsort(owner, kind="stable")
        actors, starts = np.unique(owner[order], return_index=True)
        ends = np.append(starts[1:], n)
        ver = self.version
        # the slots' actors of this table: a newer one applied before the reads
        # start (set_routing runs between gather and them) may retire a slot
        # these reads were routed to; its actors stay until they drain
        slots, names = self._slots, self.slot_names
        self._inflight[ver] = self._inflight.get(ver, 0) + 1
        try:
            outs = list(await asyncio.gather(*[
                self._read(int(a), reads[order[st:en]], slots[int(a)], names[int(a)])
                for a, st, en in zip(actors, starts, ends)]))
        finally:
            self._inflight[ver] -= 1
            if ver < self.version:
                async with self._drain:
                    self._drain.notify_all()
        return outs, order, starts, ends

    async def _read(self, slot: int, rows: np.ndarray, cands=None, names=None):
        """One read of source-loader slot ``slot``, moved to its next standby when the
        serving actor is lost (killed, crashed, its node gone) or gives no answer within
        ``read_timeout`` (stalled).  A read holds no progress, so any replica gives the
        same bytes; Ray restarts a lost actor in the background and it becomes a standby
        again.  PolyloadIOError naming the slot's actors when every one failed."""
        if cands is None:  # the current table's
            cands, names = self._slots[slot], self.slot_names[slot]
        if not cands:
            raise polyload.PolyloadIOError(
                _core.EIO, "EIO", f"constructor {self._index}: routing table v"
                f"{self.version} sends a read to retired slot {slot}")
        import ray.exceptions as rex  # noqa: PLC0415

        errors: Dict[int, str] = {}  # per candidate: its last failure
        died = [0] * len(cands)  # ActorDiedError in a row: twice means gone for good
        # While every candidate is lost, wait up to read_timeout for Ray's restarts (a
        # call to a restarting actor waits for it; one to an actor gone for good fails).
        deadline = time.monotonic() + self._read_timeout
        attempt = 0
        while True:
            attempt += 1
            i = self._active[slot] % len(cands)
            actor = cands[i]
            try:
                return await asyncio.wait_for(actor.read.remote(rows), self._read_timeout)
            except Exception as e:  # noqa: BLE001 - a lost actor moves on, others raise
                exc = unwrap(e)
                if not (actor_lost(exc) or isinstance(exc, asyncio.TimeoutError)):
                    raise exc from None
                why = ("no answer within read_timeout="
                       f"{self._read_timeout:g} s" if isinstance(exc, asyncio.TimeoutError)
                       else f"{type(exc).__name__}")
                errors[i] = f"{names[i]}: {why}"
                died[i] = died[i] + 1 if isinstance(exc, rex.ActorDiedError) else 0
                if self._active[slot] == i:  # peers may have moved it already
                    self._active[slot] = (i + 1) % len(cands)
                self.failovers.append({"slot": slot, "from": names[i],
                                       "to": names[self._active[slot] % len(names)],
                                       "reason": why, "time": time.time()})
                if min(died) >= 2 or (attempt >= len(cands) and time.monotonic() >= deadline):
                    break
                if attempt % len(cands) == 0:
                    await asyncio.sleep(0.05)  # every one is lost: Ray restarts them
        sources = sorted({int(x) for x in rows[:, 0]})
        raise polyload.PolyloadIOError(
            _core.EIO, "EIO",
            f"constructor {self._index}: no source loader could read sources {sources} "
            f"(slot {slot}; tried {'; '.join(errors[j] for j in sorted(errors))})")
