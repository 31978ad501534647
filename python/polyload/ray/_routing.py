"""The routing table: which source-loader slot owns which documents of which source.

Batches never depend on it: a read holds no progress and any loader holding a
partition answers the same bytes.  :func:`polyload.ray.launch` builds the first table
(:meth:`RoutingTable.launch`); from then on the autoscaler owns it and publishes each
new version to the planner (which keeps it in its checkpoint and routes its length
calls by it) and to every data constructor (which routes reads by it).  A table
travels between the actors as this object.  Imports no Ray.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

#: A document's routing key is ``source << KEY_SHIFT | document index`` (int64).
KEY_SHIFT = 40


def split_ranges(n_docs: int, parts: int) -> List[Tuple[int, int]]:
    """``parts`` index ranges ``(first, end)`` covering ``[0, n_docs)``, equal to within
    one document; never more ranges than documents (one empty range for none)."""
    parts = max(1, min(int(parts), max(1, int(n_docs))))
    edges = np.linspace(0, n_docs, parts + 1).round().astype(np.int64)
    return [(int(edges[p]), int(edges[p + 1])) for p in range(parts)]


def launch_partitions(names: Sequence[str], num_documents: Sequence[int],
                      num_source_loaders: Union[int, Mapping[str, int]]
                      ) -> List[Tuple[int, int, int]]:
    """Index-range partitions ``(source index, first, end)`` of :func:`polyload.ray.launch`:
    ``num_source_loaders`` per source (an int for every source, or a dict by source
    name, missing names 1), split by :func:`split_ranges`.

    Raises:
        ValueError: an unknown source name, or a count under 1.
    """
    if isinstance(num_source_loaders, Mapping):
        unknown = set(num_source_loaders) - set(names)
        if unknown:
            raise ValueError(f"num_source_loaders: unknown sources {sorted(unknown)}")
        counts = [int(num_source_loaders.get(n, 1)) for n in names]
    else:
        counts = [int(num_source_loaders)] * len(names)
    if any(c < 1 for c in counts):
        raise ValueError("num_source_loaders must be at least 1 per source")
    return [(s, lo, hi) for s, (c, n) in enumerate(zip(counts, num_documents))
            for lo, hi in split_ranges(n, c)]


@dataclasses.dataclass
class RoutingTable:
    """One version of a deployment's routing.

    Attributes:
        sources: the source names, in config order.
        partitions: ``[source name, first, end, slot]``: documents ``[first, end)`` of
            the source are read from slot ``slot``.
        slots: per slot, its serving actor's name, then its standbys'.  Slot indices
            only grow (a slot is never renumbered or reused).
        namespace: the deployment's Ray namespace.
        version: bumped by each change (0: launch's table).
        dedicated: per slot, the index of the source it is dedicated to (None: a
            shared slot of launch).
        retired: slots whose actors are gone (no partition may name them).
        pinned: sources held at a size by hand (``Deployment.scale``): source index ->
            dedicated loaders.
    """

    sources: List[str]
    partitions: List[List[Any]]
    slots: List[List[str]]
    namespace: str
    version: int = 0
    dedicated: Optional[List[Optional[int]]] = None
    retired: List[int] = dataclasses.field(default_factory=list)
    pinned: Dict[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dedicated is None:
            self.dedicated = [None] * len(self.slots)

    # -------------------------------------------------------------------- views

    @property
    def source_loaders(self) -> List[str]:
        """Each slot's serving actor name."""
        return [x[0] for x in self.slots]

    def live_slots(self) -> List[int]:
        """The slots not retired, in order."""
        gone = set(int(j) for j in self.retired)
        return [j for j in range(len(self.slots)) if j not in gone]

    def slots_of(self, source: int) -> List[int]:
        """The slots holding a partition of source index ``source``, sorted."""
        name = self.sources[source]
        return sorted({int(slot) for n, _lo, _hi, slot in self.partitions if n == name})

    def slot_shards(self) -> List[List[Tuple[int, int, int]]]:
        """Per slot, its partitions as ``(source index, first, end)``."""
        index = {n: s for s, n in enumerate(self.sources)}
        out: List[List[Tuple[int, int, int]]] = [[] for _ in self.slots]
        for name, lo, hi, slot in self.partitions:
            out[int(slot)].append((index[name], int(lo), int(hi)))
        return out

    def owner_of(self, source: int, idx: np.ndarray) -> np.ndarray:
        """The slot that owns each document index of ``source`` (int64 array in, int64
        array of slots out, same shape)."""
        name = self.sources[source]
        parts = sorted((lo, owner) for n, lo, _hi, owner in self.partitions if n == name)
        los = np.asarray([p[0] for p in parts], dtype=np.int64)
        owners = np.asarray([p[1] for p in parts], dtype=np.int64)
        return owners[np.searchsorted(los, idx, side="right") - 1]

    def for_constructors(self) -> Tuple[List[Tuple[List[int], List[int]]], List[List[str]]]:
        """``(routing, slot_names)``: per source (partition starts, slot per partition)
        sorted by start, and per slot its actor's name then its standbys' (none for a
        retired slot: its actors are gone, and slot indices are never reused)."""
        index = {n: s for s, n in enumerate(self.sources)}
        gone = set(int(j) for j in self.retired)
        per: list = [[] for _ in self.sources]
        for name, lo, _hi, slot in self.partitions:
            per[index[name]].append((int(lo), int(slot)))
        routing = []
        for parts in per:
            parts.sort()
            routing.append(([lo for lo, _ in parts], [a for _, a in parts]))
        return routing, [[] if j in gone else list(x) for j, x in enumerate(self.slots)]

    # ------------------------------------------------------------------ checking

    def check(self, num_documents: Sequence[int]) -> None:
        """Refuse a table that leaves a document of a source unowned or owned twice, or
        names a slot that does not exist or is retired.

        Raises:
            ValueError: naming the source, the documents and the slot.
        """
        names = list(self.sources)
        n_slots = len(self.slots)
        gone = set(int(j) for j in self.retired)
        per: Dict[str, List[Tuple[int, int]]] = {n: [] for n in names}
        for name, lo, hi, slot in self.partitions:
            if name not in per or not 0 <= int(slot) < n_slots or not lo < hi:
                raise ValueError(f"routing: bad partition {[name, lo, hi, slot]}")
            if int(slot) in gone:
                raise ValueError(f"routing: partition {[name, lo, hi, slot]} on retired "
                                 f"slot {slot}")
            per[name].append((int(lo), int(hi)))
        for s, name in enumerate(names):
            at = 0
            for lo, hi in sorted(per[name]):
                if lo != at:
                    raise ValueError(f"routing: source {name}: documents {min(lo, at)}.."
                                     f"{max(lo, at)} are owned "
                                     f"{'twice' if lo < at else 'by nobody'}")
                at = hi
            if at != int(num_documents[s]) and num_documents[s] > 0:
                raise ValueError(f"routing: source {name}: documents {at}..{num_documents[s]} "
                                 f"are owned by nobody")


def key_index(routing: Sequence[Tuple[Sequence[int], Sequence[int]]]
              ) -> Tuple[np.ndarray, np.ndarray]:
    """``(starts, owners)``: the partitions of :meth:`RoutingTable.for_constructors`'s
    ``routing`` as sorted routing keys (``source << KEY_SHIFT | first``, int64) and the
    slot of each (int64): a read's slot is ``owners[searchsorted(starts, key,
    "right") - 1]``."""
    keys = [(s << KEY_SHIFT | int(lo), int(a)) for s, (los, owners) in
            enumerate(routing) for lo, a in zip(los, owners)]
    keys.sort()
    return (np.asarray([k for k, _ in keys], dtype=np.int64),
            np.asarray([a for _, a in keys], dtype=np.int64))
