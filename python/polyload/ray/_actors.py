"""The three roles as Ray actors (DESIGN.md, "Distributed deployment (Ray)").

Each actor receives the config (YAML text or a dict) and builds its C objects inside its
own process; C handles never travel.  Errors raised in a method are polyload's own
exception types (picklable); Ray wraps them and :func:`polyload.ray._common.unwrap`
takes the wrapper off again on the other side.

- :class:`Planner`: opens the sources for their document lengths, emits one encoded plan
  per step (``pl_plan_encode``) and the state blob at the step's start.  Never reads a
  payload.  Also the deployment's registry: the layout that clients look up.
- :class:`SourceLoader`: one or several partitions ``(source, first index, end index)``;
  ``read`` answers token ranges (``pl_source_read_many``) as one int64 array, which Ray
  puts in its object store.  Holds no training progress.
- :class:`DataConstructor`: the fan-out layer for a group of DP ranks and all their TP,
  PP and CP peers.  A producer thread fetches plans, asks the source loaders for the
  ranges its ranks need (``pl_plan_reads``), builds the micro-batches
  (``pl_constructor_build``) and puts them in the object store, a bounded number of
  steps ahead of the slowest served rank (back-pressure).
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from ._common import (
    blob_at,
    blob_position,
    enter_cwd,
    make_config,
    stale_error,
    unwrap,
)

_ARRAY_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens")


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _micro_batches_per_rank(cfg) -> int:
    return cfg.get_int("micro_batches_per_rank")


# ======================================================================= planner


@ray.remote(num_cpus=0)
class Planner:
    """The planner actor: plans from metadata only, and the deployment's registry.

    ``plan(gen, step, constructor)`` returns ``(state blob at the step's start, encoded
    plan or None after train_steps, step statistics)``.  Plans are generated in order
    and kept until every constructor fetched them.  ``restart(blob)`` moves the whole
    deployment to a state (a new *generation*); constructors follow with ``sync``.
    """

    def __init__(self, payload, cwd: str, num_constructors: int) -> None:
        self._payload, self._cwd = payload, cwd
        self._num_constructors = int(num_constructors)
        self._planner = None
        self._info: Dict[str, Any] = {}

    def setup(self) -> Dict[str, Any]:
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        self._planner = _core.Planner.create(cfg)
        self._nmb = _micro_batches_per_rank(cfg)
        self._dp = cfg.get_int("topology.dp")
        self._train_steps = cfg.get_int("train_steps")  # -1: endless
        self._gen = 0
        self._start_hash: Optional[bytes] = None
        self._start_k = 0
        self._reset_cache(0)
        return {
            "num_documents": [len(s) for s in self._planner.sources],
            "names": [cfg.source_name(i) for i in range(cfg.num_sources)],
            "pid": os.getpid(),
            "node_id": _node_id(),
        }

    def _reset_cache(self, step: int) -> None:
        self._cache: Dict[int, Tuple[bytes, Optional[bytes], Optional[Dict]]] = {}
        self._next_step = step
        self._end: Optional[int] = None
        self._fetched: Dict[int, int] = {}

    def set_info(self, info: Dict[str, Any]) -> None:
        self._info = dict(info)

    def info(self) -> Dict[str, Any]:
        return self._info

    def current(self) -> Tuple[int, int]:
        """(generation, first micro-batch index k = step * micro_batches + mb)."""
        return self._gen, self._start_k

    def plan(self, gen: int, step: int, constructor: int):
        if gen != self._gen:
            return None  # stale: the constructor syncs first
        while (self._end is None and self._next_step <= step):
            s = self._next_step
            blob = self._planner.get_state()
            ended = 0 <= self._train_steps <= s
            p = None if ended else self._planner.next_plan()
            if p is None:
                self._cache[s] = (blob, None, None)
                self._end = s
                break
            d = p.to_dict()
            cost = np.asarray(d["rank_cost"], dtype=np.float64)
            mx, total = float(cost.max()) if cost.size else 0.0, float(cost.sum())
            stats = {
                "max_over_mean": mx / (total / len(cost)) if total > 0 else 0.0,
                "max_over_lower_bound": mx / d["lower_bound"] if d["lower_bound"] > 0 else 0.0,
            }
            self._cache[s] = (blob, p.encode(), stats)
            self._next_step = s + 1
        if self._end is not None and step >= self._end:
            return self._cache[self._end]
        entry = self._cache.get(step)
        if entry is None:
            raise stale_error(f"planner: step {step} is no longer cached (constructor {constructor})")
        self._fetched[constructor] = max(self._fetched.get(constructor, -1), step)
        if len(self._fetched) >= self._num_constructors:
            low = min(self._fetched.values())
            for s in [s for s in self._cache if s < low and s != self._end]:
                del self._cache[s]
        return entry

    def restart(self, blob: bytes, force: bool = False) -> Tuple[int, int]:
        """Continue the deployment from a state blob: a new generation, unless ``blob``
        is the one the current generation started from (several ranks loading the same
        state restart the deployment once).  Raises StateError as the embedded loader."""
        blob = bytes(blob)
        h = hashlib.sha256(blob).digest()
        if not force and h == self._start_hash:
            return self._gen, self._start_k
        step, mb, dp = blob_position(blob)
        sealed = len(blob) >= 8 and zlib.crc32(blob[:-4]) & 0xFFFFFFFF == int.from_bytes(
            blob[-4:], "little")
        if sealed and (mb < 0 or mb >= self._nmb or (mb != 0 and dp != self._dp)):
            if mb == 0 or dp == self._dp:
                raise polyload.StateError(
                    _core.ESTATE, "ESTATE",
                    f"state: micro-batch cursor {mb} out of range [0, {self._nmb})")
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"state: saved in the middle of step {step} with dp={dp}; dp may change "
                f"only at a step boundary (config dp={self._dp})")
        before = self._planner.get_state()
        try:
            self._planner.set_state(blob)  # corrupt blob or fingerprint: StateError
        except BaseException:
            self._planner.set_state(before)
            raise
        self._gen += 1
        self._start_hash = h
        self._start_k = step * self._nmb + mb
        self._reset_cache(step)
        return self._gen, self._start_k

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self._planner = None


# ================================================================= source loader


@ray.remote(num_cpus=0)
class SourceLoader:
    """Payloads of index-range partitions of sources: ``shards`` is a list of
    ``(source index, first document, end document)``.  ``read(reads)`` takes an int64
    array ``[n, 4]`` of ``(source, index, offset, count)`` (rows of one source
    together) and returns their tokens back to back as one int64 array."""

    def __init__(self, payload, cwd: str, shards: Sequence[Tuple[int, int, int]]) -> None:
        self._payload, self._cwd = payload, cwd
        self._shards = [tuple(int(x) for x in s) for s in shards]
        self._sources: Dict[int, Any] = {}

    def setup(self) -> Dict[str, Any]:
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._ranges: Dict[int, List[Tuple[int, int]]] = {}
        for s, lo, hi in self._shards:
            if s not in self._sources:
                self._sources[s] = cfg.open_source(s)
            self._ranges.setdefault(s, []).append((lo, hi))
        self._names = {s: cfg.source_name(s) for s in self._sources}
        return {"pid": os.getpid(), "node_id": _node_id(), "shards": self._shards}

    def read(self, reads: np.ndarray) -> np.ndarray:
        reads = np.ascontiguousarray(reads, dtype=np.int64).reshape(-1, 4)
        if len(reads) == 0:
            return np.zeros(0, dtype=np.int64)
        src = reads[:, 0]
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(src)) + 1, [len(reads)]])
        parts = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            s = int(src[a])
            ranges = self._ranges.get(s)
            idx = reads[a:b, 1]
            ok = np.zeros(len(idx), dtype=bool)
            for lo, hi in ranges or ():
                ok |= (idx >= lo) & (idx < hi)
            if not ok.all():
                bad = int(idx[~ok][0])
                raise polyload.RangeError(
                    _core.ERANGE, "ERANGE",
                    f"source loader: document {bad} of source {s} is outside its partitions "
                    f"{ranges}")
            parts.append(np.asarray(self._sources[s].read_many(reads[a:b])))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass  # the sources close with the process


# ============================================================= data constructor


@ray.remote(num_cpus=0)
class DataConstructor:
    """Builds the micro-batches of a group of DP ranks for every global rank of the
    group (TP, PP and CP peers included), ``prefetch_steps`` steps ahead of the slowest
    served rank.  Trainers call ``next(rank, k, gen, consumed)`` for micro-batch number
    ``k`` (``step * micro_batches_per_rank + micro_batch``) and receive ``[ref, meta]``
    (ref: the batch dict in the object store) or None after ``train_steps``."""

    def __init__(self, payload, cwd: str, index: int, dp_ranks: Sequence[int],
                 planner: str, loaders: Sequence[str], routing, namespace: str,
                 prefetch_steps: int) -> None:
        self._payload, self._cwd = payload, cwd
        self._index = int(index)
        self._dp_ranks = [int(d) for d in dp_ranks]
        self._planner_name, self._loader_names = planner, list(loaders)
        self._routing = routing  # per source: (bounds, actor index per partition)
        self._namespace = namespace
        self._prefetch_steps = max(1, int(prefetch_steps))
        self._idle_steps = max(16, 4 * self._prefetch_steps)
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def setup(self) -> Dict[str, Any]:
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        self._ctor = _core.Constructor.create(cfg)
        self._nmb = _micro_batches_per_rank(cfg)
        self._dp = cfg.get_int("topology.dp")
        infos = [cfg.rank_info(r) for r in range(cfg.world_size())]
        self._ranks = [i["rank"] for i in infos if i["dp_rank"] in self._dp_ranks]
        # Ranks with the same DP rank, CP slice and fields get the same batch (TP peers).
        self._key = {i["rank"]: (i["dp_rank"], i["cp_rank"], i["fields"])
                     for i in infos if i["rank"] in self._ranks}
        self._rep: Dict[Tuple, int] = {}
        for r in self._ranks:
            self._rep.setdefault(self._key[r], r)
        self._planner = ray.get_actor(self._planner_name, namespace=self._namespace)
        self._loaders = [ray.get_actor(n, namespace=self._namespace) for n in self._loader_names]
        self._bounds = [np.asarray(b, dtype=np.int64) for b, _ in self._routing]
        self._owner = [np.asarray(a, dtype=np.int64) for _, a in self._routing]
        self._cv = threading.Condition()
        self._gen = 0
        self._reset(0, 0)
        self._thread = threading.Thread(target=self._run, name="polyload-constructor",
                                        daemon=True)
        self._thread.start()
        return {"pid": os.getpid(), "node_id": _node_id(), "ranks": self._ranks}

    # ------------------------------------------------------------ state of a generation

    def _reset(self, gen: int, start_k: int) -> None:
        self._gen = gen
        self._queue: Dict[int, Dict[int, Tuple[Any, Dict]]] = {r: {} for r in self._ranks}
        self._low = {r: start_k for r in self._ranks}        # least k not yet requested
        self._consumed = {r: start_k for r in self._ranks}   # k the trainer consumed up to
        # Ranks that asked for a batch in this generation.  Only they hold the producer
        # back, so a rank that never asks (e.g. a middle pipeline stage that needs no
        # data) does not stop its peers; its batches are dropped once they fall
        # _idle_steps behind the slowest active rank (trainers in lockstep are at most a
        # step apart; a late start of a few steps is fine).
        self._active: set = set()
        self._blobs: Dict[int, bytes] = {}
        self._end_k: Optional[int] = None
        self._failure: Optional[BaseException] = None
        self._step = start_k // self._nmb                    # next step to issue
        self._published = start_k                            # micro-batches built so far
        self._first = start_k                                # first micro-batch of the generation
        self._restart = True

    def sync(self, gen: int) -> int:
        """Follow the planner to generation ``gen`` (after a restart from a state)."""
        with self._cv:
            if gen <= self._gen:
                return self._gen
        g, start_k = ray.get(self._planner.current.remote())
        with self._cv:
            if g > self._gen:
                self._reset(g, start_k)
                self._cv.notify_all()
            return self._gen

    # --------------------------------------------------------------------- serving

    def next(self, rank: int, k: int, gen: int, consumed: int):
        if gen > self._gen:
            self.sync(gen)
        with self._cv:
            if gen != self._gen:
                raise stale_error(
                    f"polyload.ray: the deployment was restarted from another state "
                    f"(generation {self._gen}, this client has {gen}); call load_state_dict")
            if rank not in self._queue:
                raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                          f"constructor {self._index}: rank {rank} is not served here")
            self._active.add(rank)
            if k + 1 > self._low[rank]:
                self._low[rank] = k + 1
            if consumed > self._consumed[rank]:
                self._consumed[rank] = consumed
            self._cv.notify_all()
            while True:
                if gen != self._gen:
                    raise stale_error("polyload.ray: the deployment was restarted meanwhile")
                item = self._queue[rank].pop(k, None)
                if item is not None:
                    self._prune_blobs()
                    return [item[0], item[1]]
                if self._end_k is not None and k >= self._end_k:
                    return None
                if k < self._published or k < self._first:
                    raise stale_error(
                        f"polyload.ray: micro-batch {k} of rank {rank} was already served "
                        f"(the deployment stands at {self._published}); load a state with "
                        f"load_state_dict to restart it")
                if self._failure is not None:
                    raise self._failure
                if self._closed:
                    raise polyload.PolyloadError(_core.ECLOSED, "ECLOSED", "constructor is closed")
                self._cv.wait(timeout=1.0)

    def _min_over_active(self, d: Dict[int, int]) -> int:
        return min(d[r] for r in self._active) if self._active else self._first

    def _prune_blobs(self) -> None:
        low = self._min_over_active(self._consumed) // self._nmb
        for s in [s for s in self._blobs if s < low]:
            del self._blobs[s]

    def state(self, k: int, gen: int) -> bytes:
        """The state blob after micro-batch ``k - 1`` (SPEC section 4)."""
        step, mb = divmod(int(k), self._nmb)
        with self._cv:
            while True:
                if gen != self._gen:
                    raise stale_error("polyload.ray: the deployment was restarted from another state")
                blob = self._blobs.get(step)
                if blob is not None:
                    return blob_at(blob, mb, self._dp)
                if self._failure is not None:
                    raise self._failure
                if self._end_k is not None and step > self._end_k // self._nmb:
                    raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                              f"state: step {step} is past the end")
                if self._min_over_active(self._consumed) // self._nmb > step:
                    raise stale_error(f"state: step {step} was already released")
                self._cv.wait(timeout=1.0)

    def position(self) -> Tuple[int, int]:
        """(generation, least micro-batch index that every served rank reported consumed)."""
        with self._cv:
            return self._gen, self._min_over_active(self._consumed)

    # -------------------------------------------------------------------- producing

    def _may_issue(self) -> bool:
        if self._restart or self._closed or self._failure is not None:
            return False
        if self._end_k is not None:
            return False
        low = self._min_over_active(self._low)
        return self._step * self._nmb < low + self._prefetch_steps * self._nmb

    def _run(self) -> None:
        pending = None
        while True:
            with self._cv:
                if self._closed:
                    return
                if self._restart:
                    self._restart = False
                    pending = None
                gen, step = self._gen, self._step
                can = self._may_issue()
                if not can and pending is None:
                    self._cv.wait(timeout=0.5)
                    continue
                if can:
                    self._step += 1
            issued = None
            try:
                if can:
                    issued = self._issue(gen, step)
                if pending is not None:
                    self._finish(pending)
            except BaseException as e:  # noqa: BLE001 - reaches the trainer
                with self._cv:
                    if gen == self._gen and not self._restart:
                        self._failure = unwrap(e)
                        self._cv.notify_all()
                pending = None
                continue
            pending = issued

    def _issue(self, gen: int, step: int):
        """Fetch the plan of ``step`` and ask the source loaders for its ranges."""
        res = ray.get(self._planner.plan.remote(gen, step, self._index))
        if res is None:  # the planner moved to a newer generation: wait for sync
            with self._cv:
                if gen == self._gen:
                    self._step = step
                while gen == self._gen and not self._closed and not self._restart:
                    self._cv.wait(timeout=0.5)
            return None
        blob, pbytes, stats = res
        with self._cv:
            if gen != self._gen:
                return None
            self._blobs[step] = blob
            if pbytes is None:
                self._end_k = step * self._nmb
                self._cv.notify_all()
                return None
        plan = _core.Plan.decode(pbytes)
        blocks, arrs = [], []
        for mb in range(self._nmb):
            for dp in self._dp_ranks:
                a = np.asarray(plan.reads(dp, mb)).reshape(-1, 4)
                blocks.append((mb, dp, len(a)))
                arrs.append(a)
        reads = np.concatenate(arrs) if arrs else np.zeros((0, 4), dtype=np.int64)
        owner = np.zeros(len(reads), dtype=np.int64)
        for s in np.unique(reads[:, 0]):
            m = reads[:, 0] == s
            part = np.searchsorted(self._bounds[s], reads[m, 1], side="right") - 1
            owner[m] = self._owner[s][part]
        calls = []
        for a in np.unique(owner):
            sel = np.flatnonzero(owner == a)
            order = sel[np.argsort(reads[sel, 0], kind="stable")]
            calls.append((order, self._loaders[int(a)].read.remote(reads[order])))
        return gen, step, plan, stats, blocks, reads, calls

    def _finish(self, pending) -> None:
        """Receive the payloads of an issued step, build and publish its micro-batches."""
        gen, step, plan, stats, blocks, reads, calls = pending
        refs = [ref for _, ref in calls]
        outs = ray.get(refs)
        payloads: List[Any] = [None] * len(reads)
        counts = reads[:, 3]
        for (order, _), out in zip(calls, outs):
            ends = np.cumsum(counts[order])
            starts = ends - counts[order]
            for j, a, b in zip(order.tolist(), starts.tolist(), ends.tolist()):
                payloads[j] = out[a:b]
        published: Dict[int, Dict[int, Tuple[Any, Dict]]] = {r: {} for r in self._ranks}
        pos = 0
        by_dp = {}
        for mb, dp, n in blocks:
            by_dp[(mb, dp)] = payloads[pos:pos + n]
            pos += n
        for mb in range(self._nmb):
            k = step * self._nmb + mb
            built: Dict[Tuple, Tuple[Any, Dict]] = {}
            for key, r in self._rep.items():
                b = self._ctor.build(plan, r, mb, by_dp[(mb, key[0])])
                d: Dict[str, Any] = {}
                for name in _ARRAY_FIELDS:
                    arr = getattr(b, name)
                    if arr is not None:
                        d[name] = np.asarray(arr)
                if b.max_seqlen is not None:
                    d["max_seqlen"] = int(b.max_seqlen)
                meta = {"k": k, "step": step, "micro_batch": mb, "tokens": int(b.tokens),
                        "padding": int(b.rows * b.cols - b.tokens), "step_stats": stats}
                built[key] = (ray.put(d), meta)
                del d
                b.release()
            for r in self._ranks:
                published[r][k] = built[self._key[r]]
        with self._cv:
            if gen != self._gen:
                return
            for r in self._ranks:
                self._queue[r].update(published[r])
            self._published = (step + 1) * self._nmb
            if self._active and len(self._active) < len(self._ranks):
                floor = (self._min_over_active(self._low) // self._nmb
                         - self._idle_steps) * self._nmb
                for r in self._ranks:
                    if r not in self._active:
                        for kk in [kk for kk in self._queue[r] if kk < floor]:
                            del self._queue[r][kk]
            self._cv.notify_all()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self._closed = True
        cv = getattr(self, "_cv", None)
        if cv is not None:
            with cv:
                cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
