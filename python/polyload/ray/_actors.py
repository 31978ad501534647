"""The three roles as Ray actors (DESIGN.md, "Distributed deployment (Ray)").

Each actor receives the config (YAML text or a dict) and builds its C objects inside its
own process; C handles never travel, and no C format is parsed here: the actors move
bytes between C calls.

- :class:`Planner`: opens the sources for their document lengths and emits, per step,
  the encoded plan (``pl_plan_encode``).  Never reads a payload.  Keeps the state blob
  of each step's start (packed (``pl_state_pack``), for the steps some rank may still stand at),
  which trainers fetch only when ``state_dict()`` or ``stats()`` need it: packages carry
  no state, so the per-source part of the state is held once, not per rank and step.
  Also the deployment's registry and the keeper of its generation (the state it was
  last restarted from).
- :class:`SourceLoader`: index-range partitions of one or more sources; ``read`` answers
  token ranges at their stored width (``pl_source_read_raw``), or, when the config has
  image-text sources, a reply (``pl_reply_encode``) that adds each read's image, decoded
  and resized here.  Holds no training progress, so any replica can serve any key of its
  partitions.
- :class:`DataConstructor`: the fan-out layer for a group of DP ranks and all their TP,
  PP and CP peers.  It hosts a ``pl_pipeline`` (polyload._core.Pipeline): the C object
  that also drives the embedded loader decides which step to plan and which unit to
  build, holds back-pressure and the lag policy.  A unit is one DP rank's step; it is
  built as a *package* (``pl_package_encode``: the rank's plan and its tokens at stored
  width) and returned to each trainer rank of that DP rank as the result of
  its ``fetch`` call, which the trainer expands into micro-batches in C
  (``pl_loader_push_package``).  An async actor: its waits are awaits, never polls.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import pickle
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from ._common import (StoodDown, actor_lost, enter_cwd, has_failure_detection_env,
                      make_config, routing_for_constructors, sources_digest, unwrap)

_KEY_SHIFT = 40  # routing key: source << 40 | document index
_WARM_DOCS = 1 << 15  # raw documents per source whose owners a scaling event may warm
_WARM_STEPS = 16  # steps after planning that a raw document's tokens may still be read

_WIDTH = {_core.DTYPE_UINT8: 1, _core.DTYPE_INT8: 1, _core.DTYPE_INT16: 2,
          _core.DTYPE_UINT16: 2, _core.DTYPE_INT32: 4, _core.DTYPE_UINT32: 4,
          _core.DTYPE_INT64: 8, _core.DTYPE_FLOAT32: 4, _core.DTYPE_FLOAT64: 8}


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _error_parts(exc: BaseException) -> Tuple[int, str]:
    """(status code, message) of an exception, for a pipeline failure: polyload's own
    errors keep their code and message; anything else becomes EIO naming its type."""
    exc = unwrap(exc)
    if isinstance(exc, polyload.PolyloadError):
        return exc.code, exc.message
    return _core.EIO, f"{type(exc).__name__}: {exc}"


# ======================================================================= planner


def _owner_of(table, source: int, idx: np.ndarray) -> np.ndarray:
    """The slot that owns each document index of ``source`` in a routing table."""
    name = table["sources"][source]
    parts = sorted((lo, owner) for n, lo, _hi, owner in table["partitions"] if n == name)
    los = np.asarray([p[0] for p in parts], dtype=np.int64)
    owners = np.asarray([p[1] for p in parts], dtype=np.int64)
    return owners[np.searchsorted(los, idx, side="right") - 1]


#: The most plans a constructor asks the planner for in one call: a plan covers the
#: whole global batch, so calls of ``prefetch_steps`` (up to 512) could be tens of MB and
#: hold the planner (one call at a time) from ``state`` calls.
PLANS_PER_CALL = 64


def _pack_fetch(out: List[Any], error: Optional[Tuple[int, str]] = None) -> Tuple[Any, ...]:
    """A fetch's answer as one buffer: ``(packages, ends, final)``, package k being
    ``packages[ends[k-1]:ends[k]]``, ``final`` the state blob of step train_steps when the
    fetch reached it (else None); with a fourth element ``error``, ``(code, message)``,
    when the step after the last package failed.  One Ray object with one buffer: a
    list of packages cost Ray ~30 % more CPU per call at 128 packages of 33 KB
    (bench/README.md, "Stop 26"); the copy here is ~0.1 ms per MB."""
    final = None
    if out and not isinstance(out[-1], np.ndarray):
        final, out = bytes(out[-1]), out[:-1]
    ends = np.cumsum([len(a) for a in out], dtype=np.int64)
    buf = out[0] if len(out) == 1 else (np.concatenate(out) if out else
                                        np.zeros(0, dtype=np.uint8))
    # the error only when there is one: a Client of protocol 1 reads three elements
    return (buf, ends, final) if error is None else (buf, ends, final, error)


def _kv_get(key: bytes):
    from ray.experimental import internal_kv  # noqa: PLC0415

    data = internal_kv._internal_kv_get(key)
    return pickle.loads(data) if data else None


def _kv_put(key: bytes, data: bytes) -> None:
    from ray.experimental import internal_kv  # noqa: PLC0415

    internal_kv._internal_kv_put(key, data, overwrite=True)


def _kv_del(key: bytes) -> None:
    from ray.experimental import internal_kv  # noqa: PLC0415

    internal_kv._internal_kv_del(key)



class Planner:
    """The planner actor: plans from metadata only, and the deployment's registry.

    ``plan(gen, step)`` returns ``(None, encoded plan)``, and for step train_steps
    ``(its state blob, None)``.  Plans are made in step order and kept in a window until
    every constructor has fetched them.  ``state(gen, step)`` is the packed (``pl_state_pack``)
    state blob of a step's start; kept from the least step a constructor reports for
    its ranks (``low``), and at most ``keep_steps`` behind the newest planned step.
    ``restart(blob)`` moves the deployment to a state (a new *generation*) unless it is
    the state the current generation started from and that start can still be served;
    constructors follow with ``sync``.
    """

    def __init__(self, payload, cwd: str, num_constructors: int, max_lag_steps: int,
                 keep_steps: int = 0, checkpoint_steps: int = 8) -> None:
        self._payload, self._cwd = payload, cwd
        self._num_constructors = int(num_constructors)
        self._max_lag = int(max_lag_steps)
        self._keep = max(int(keep_steps), int(max_lag_steps) + 1)
        self._ckpt_every = max(1, int(checkpoint_steps))
        self._ckpt_step = -1
        self._ckpt_blob: Optional[bytes] = None
        self.checkpoint_bytes = 0  # written to the store so far
        self.checkpoints = 0
        self._planner = None
        self._info: Dict[str, Any] = {}
        self._low: Dict[int, int] = {}

    def setup(self) -> Dict[str, Any]:
        """Open the sources and plan from the start, or, after Ray restarted the actor
        (its process died), from its last checkpoint in Ray's internal KV store (the
        generation, the state it started from, the registry, and the state of a step
        no rank is behind, written every ``checkpoint_steps`` steps): plans are
        deterministic, so the steps after the checkpoint are planned again exactly."""
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        # Raw text sources hold lengths only here: the source loaders tokenize (once per
        # actor, keeping the tokens for the constructors' reads) and report lengths.
        self._loader_handles: Dict[str, Any] = {}
        self._inflight_lock = threading.Lock()
        self._inflight: Dict[int, int] = {}  # lengths calls running, by routing version
        # raw text documents whose lengths were fetched last, per source (warm-up of the
        # new owners after a scaling event)
        self._fetch_log: Dict[int, Any] = {}
        self._planned: Any = collections.deque()  # per step: raw documents it planned
        self.warmed = 0
        cfg.set_lengths_provider(self._lengths)
        self._planner = _core.Planner.create(cfg)
        self._train_steps = cfg.get_int("train_steps")  # -1: endless
        ctx = ray.get_runtime_context()
        self._kv_key = f"polyload:{ctx.namespace}:{ctx.get_actor_name()}".encode()
        saved = _kv_get(self._kv_key)
        if saved is None:
            self._gen = 0
            self._start_blob = self._planner.get_state()
            self._start_hash = hashlib.sha256(self._start_blob).digest()
            self._reset_cache(0)
            self._persist()
        else:
            self._gen, self._info = saved["gen"], saved["info"]
            self._start_blob = (_core.state_unpack(saved["start_packed"])
                                if "start_packed" in saved else saved["start"])
            if saved.get("routing"):
                self._routing = saved["routing"]
            self._start_hash = hashlib.sha256(self._start_blob).digest()
            self._reset_cache(_core.state_info(self._start_blob)["step"])
            if saved.get("ckpt") is not None:
                blob = _core.state_unpack(saved["ckpt"])
                self._ckpt_blob = saved["ckpt"]
                self._planner.set_state(blob)
                self._next_step = self._ckpt_step = _core.state_info(blob)["step"]
                # where each constructor's ranks stood then (they only move on)
                self._low = {int(k): int(v) for k, v in saved.get("low", {}).items()}
            else:
                self._planner.set_state(self._start_blob)
            self.recovered_from = self._next_step
        return {
            "num_documents": [len(s) for s in self._planner.sources],
            "names": [cfg.source_name(i) for i in range(cfg.num_sources)],
            "dtypes": [getattr(_core, "DTYPE_" + s.token_dtype.upper())
                       for s in self._planner.sources],
            "pid": os.getpid(),
            "node_id": _node_id(),
            "failure_env": has_failure_detection_env(),
        }

    def _reset_cache(self, step: int) -> None:
        self._cache: Dict[int, Tuple[bytes, Optional[bytes]]] = {}
        self._start_step = step
        self._next_step = step
        self._fetched: Dict[int, int] = {}
        self._failure: Optional[Tuple[int, BaseException]] = None
        # step -> packed blob of its start; constructor -> least step of its ranks
        self._states: Dict[int, bytes] = {}
        self._low: Dict[int, int] = {}
        # constructor -> least step a rank of it has not received (where a standby
        # that takes over may start: nothing before it is asked again)
        self._need: Dict[int, int] = {}

    def set_routing(self, names, partitions, loader_names, namespace, version: int = 0,
                    slots=None, extra: Optional[Dict[str, Any]] = None) -> None:
        """Which source loader owns which documents (before any plan is asked, and
        after each scaling event): ``partitions`` ``[source name, first, end, slot]``,
        ``loader_names[slot]`` the slot's serving actor, ``slots[slot]`` its actor and
        standbys; ``extra``: more keys kept with the table (the autoscaler's).  Kept in
        the checkpoint, so a restarted planner or autoscaler finds it."""
        self._ensure()
        table = {"sources": list(names), "partitions": [list(p) for p in partitions],
                 "source_loaders": list(loader_names), "namespace": namespace,
                 "version": int(version),
                 "slots": [list(x) for x in (slots or [[n] for n in loader_names])]}
        table.update(extra or {})  # the autoscaler's own fields (kept, not read)
        with self._inflight_lock:
            old = getattr(self, "_routing", None)
            self._routing = table
        self._persist()
        if old is not None and int(version) > int(old.get("version", 0)):
            self._warm(old, self._routing)

    def _planned_docs(self, step: int, plan) -> None:
        """Keep the fetch log of raw documents to those not planned yet or planned in
        the last _WARM_STEPS steps (the constructors may not have read them yet)."""
        rows = [np.asarray(plan.reads(d, m)) for d in range(plan.dp)
                for m in range(plan.micro_batches_per_rank)]
        rows = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
        mine = [(int(a), int(b)) for a, b in rows[:, :2].tolist() if int(a) in self._fetch_log]
        with self._inflight_lock:
            self._planned.append(mine)
            while len(self._planned) > _WARM_STEPS:
                for src, idx in self._planned.popleft():
                    self._fetch_log[src].pop(idx, None)

    def _warm(self, old, new) -> None:
        """Raw text documents whose lengths were fetched lately (the lookahead window:
        planned soon) and whose owner the new table changes: ask their new owners for
        their lengths now, so that those loaders tokenize them before the constructors
        read them (asynchronous; the answers are not needed)."""
        with self._inflight_lock:
            logs = {source: list(log) for source, log in self._fetch_log.items()}
        for source, log in logs.items():
            if not log:
                continue
            idx = np.asarray(log, dtype=np.int64)
            b = _owner_of(new, source, idx)
            moved = _owner_of(old, source, idx) != b
            for slot in np.unique(b[moved]).tolist():
                docs = idx[moved & (b == slot)].tolist()
                try:
                    h = ray.get_actor(new["source_loaders"][slot], namespace=new["namespace"])
                    h.lengths.remote(int(source), docs)  # fire and forget
                    self.warmed += len(docs)
                except Exception:  # noqa: BLE001 - only a speed-up
                    pass

    def routing(self) -> Optional[Dict[str, Any]]:
        """The routing table last set (``set_routing``'s arguments as a dict)."""
        self._ensure()
        return getattr(self, "_routing", None)

    def drained(self, version: int) -> bool:
        """True when no lengths call routed by a table older than ``version`` runs."""
        with self._inflight_lock:
            return not any(n for v, n in self._inflight.items() if v < int(version))

    @ray.method(enable_task_events=False)  # the autoscaler asks every interval_s
    def progress(self) -> Dict[str, Any]:
        """``{"next_step": next step to plan, "low": least step a constructor's ranks
        stand at (-1: not known yet), "time": monotonic seconds}`` (the autoscaler's
        clock of the training run)."""
        self._ensure()
        low = min(self._low.values()) if len(self._low) >= self._num_constructors else -1
        return {"next_step": self._next_step, "low": low, "time": time.monotonic(),
                "warmed": self.warmed,
                "start_step": self._start_step}

    def _lengths(self, source: int, indices: List[int]):
        """Lengths of raw text documents, from the source loaders that own them (called
        by the C planner's lookahead threads, in batches).  ``(lengths, {position:
        message})`` as Config.set_lengths_provider wants."""
        with self._inflight_lock:  # the table and its in-flight count, together
            info = getattr(self, "_routing", None)
            if not info:
                raise RuntimeError("planner: lengths asked before the source loaders are "
                                   "known")
            version = info.get("version", 0)
            self._inflight[version] = self._inflight.get(version, 0) + 1
        try:
            return self._lengths_by(info, source, indices)
        finally:
            with self._inflight_lock:
                self._inflight[version] -= 1

    def _lengths_by(self, info, source: int, indices: List[int]):
        with self._inflight_lock:
            log = self._fetch_log.get(source)
            if log is None:
                log = self._fetch_log[source] = collections.OrderedDict()
            for i in indices:
                log[int(i)] = None
            while len(log) > _WARM_DOCS:
                log.popitem(last=False)
        idx = np.asarray(indices, dtype=np.int64)
        owner = _owner_of(info, source, idx)
        slots = info.get("slots") or [[n] for n in info["source_loaders"]]
        calls = []
        for slot in np.unique(owner).tolist():
            pos = np.flatnonzero(owner == slot)
            calls.append((pos, slot, 0, self._handle(info, slots[slot][0]).lengths.remote(
                int(source), idx[pos].tolist())))
        lengths = [0] * len(indices)
        messages: Dict[int, str] = {}
        for pos, slot, _i, ref in calls:
            lens, msgs = self._lengths_answer(info, slots[slot], ref, int(source),
                                              idx[pos].tolist())
            for j, p in enumerate(pos.tolist()):
                lengths[p] = lens[j]
                if j in msgs:
                    messages[p] = msgs[j]
        return lengths, messages

    def _handle(self, info, name: str):
        h = self._loader_handles.get(name)
        if h is None:
            h = self._loader_handles[name] = ray.get_actor(name, namespace=info["namespace"])
        return h

    def _lengths_answer(self, info, names: List[str], ref, source: int, docs: List[int]):
        """The answer of a lengths call, asked again of the slot's standbys (then of
        its restarted actor) when the actor that got it is lost; a raw document's tokens
        hold no progress, so any of them answers the same.  PolyloadIOError naming the
        actors once each was tried twice."""
        tried = []
        for attempt in range(2 * len(names)):
            try:
                return ray.get(ref, timeout=600)
            except Exception as e:  # noqa: BLE001 - a lost actor moves on, others raise
                exc = unwrap(e)
                if not actor_lost(exc):
                    raise exc from None
                tried.append(f"{names[attempt % len(names)]}: {type(exc).__name__}")
                if len(names) == 1:
                    time.sleep(0.5)  # no standby: wait for Ray's restart
                nxt = names[(attempt + 1) % len(names)]
                ref = self._handle(info, nxt).lengths.remote(source, docs)
        raise polyload.PolyloadIOError(
            _core.EIO, "EIO",
            f"planner: no source loader could tokenize documents of source "
            f"{info['sources'][source]} (tried {'; '.join(tried)})")

    def _advance(self, step: int) -> None:
        """Plan every step up to ``step`` (stopping at a failure), keeping each plan
        and the state of its start."""
        while self._next_step <= step:
            if self._failure is not None:
                break
            s = self._next_step
            blob = self._planner.get_state()
            if 0 <= self._train_steps <= s:
                self._cache[s] = (blob, None)
            else:
                try:
                    p = self._planner.next_plan()
                except polyload.PolyloadError as e:  # sticky, as in the embedded loader
                    self._failure = (s, e)
                    # the failed step's start is where a rank that finished the steps
                    # before it stands (a Client started again for it gets the error
                    # at its first batch, not at its start)
                    self._states[s] = _core.state_pack(blob)
                    break
                self._cache[s] = (None, p.encode())
                if self._fetch_log:
                    self._planned_docs(s, p)
            self._states[s] = _core.state_pack(blob)
            self._next_step = s + 1
        self._trim_states()

    def _replan(self, step: int):
        """The plan of a step already planned and dropped (a restarted constructor asks
        again): planned once more from the kept state of its start, exactly as before
        (plans are deterministic); the planner then stands where it was."""
        blob = self._state_at(step)
        if blob is None:
            return None
        here = self._planner.get_state()
        try:
            self._planner.set_state(blob)
            if 0 <= self._train_steps <= step:
                return (self._planner.get_state(), None)
            return (None, self._planner.next_plan().encode())
        finally:
            self._planner.set_state(here)

    def _state_at(self, step: int) -> Optional[bytes]:
        """The state blob of a planned step's start: kept, or planned again from the
        nearest earlier one kept (or the checkpoint, or the generation's start)."""
        if step in self._states:
            return _core.state_unpack(self._states[step])
        if step >= self._next_step:
            self._advance(step)
            z = self._states.get(step)
            return _core.state_unpack(z) if z is not None else None
        bases = {s: z for s, z in self._states.items() if s < step}
        if self._ckpt_blob is not None and self._ckpt_step <= step:
            bases.setdefault(self._ckpt_step, self._ckpt_blob)
        if not bases:
            if self._start_step > step:
                return None
            blob = self._start_blob
        else:
            blob = _core.state_unpack(bases[max(bases)])
        here = self._planner.get_state()
        try:
            self._planner.set_state(blob)
            while _core.state_info(blob)["step"] < step:
                self._planner.next_plan()
                blob = self._planner.get_state()
            return blob
        except polyload.PolyloadError:
            return None
        finally:
            self._planner.set_state(here)

    def _ensure(self) -> None:
        if self._planner is None:
            self.setup()

    def _persist(self, ckpt: Optional[bytes] = None) -> None:
        if ckpt is None:
            ckpt = self._ckpt_blob  # the last checkpoint stays
        # the start blob packed (~20x smaller at many sources: the GCS keeps the record)
        rec = {"gen": self._gen, "start_packed": self._packed_start(), "info": self._info,
               "ckpt": ckpt, "low": dict(self._low) if ckpt is not None else {},
               "routing": getattr(self, "_routing", None)}
        data = pickle.dumps(rec, protocol=5)
        _kv_put(self._kv_key, data)
        self.checkpoint_bytes += len(data)
        self.checkpoints += 1

    def _trim_states(self) -> None:
        low = min(self._low.values()) if len(self._low) >= self._num_constructors else \
            self._start_step
        # Checkpoint: the state of a step no rank is behind, every checkpoint_steps.
        if low >= self._ckpt_step + self._ckpt_every and low in self._states:
            self._ckpt_step, self._ckpt_blob = low, self._states[low]
            self._persist(self._ckpt_blob)
        low = max(low, self._next_step - self._keep)
        if self._states and min(self._states) < low:
            for s in [s for s in self._states if s < low]:
                del self._states[s]

    def set_info(self, info: Dict[str, Any]) -> None:
        self._ensure()
        self._info = dict(info)
        self._persist()

    def info(self, client: bool = False) -> Dict[str, Any]:
        """The deployment's layout (``launch``'s info dict).  ``client``: only what a
        ``Client`` needs to check its config and find its constructors, with the source
        names as a digest (``sources_sha256``) instead of per-source lists: every
        trainer process keeps it, so it does not grow with the sources."""
        self._ensure()
        if not client:
            return self._info
        if getattr(self, "_client_info", (None,))[0] is not self._info:
            keep = ("name", "namespace", "world_size", "fingerprint", "protocol",
                    "polyload_version", "dp",
                    "micro_batches_per_rank", "num_constructors", "constructors",
                    "constructor_shadows", "dp_groups", "prefetch_steps", "max_lag_steps",
                    "fetch_steps", "read_timeout")
            brief = {k: self._info[k] for k in keep if k in self._info}
            brief["num_sources"] = len(self._info.get("sources", ()))
            brief["sources_sha256"] = sources_digest(self._info.get("sources", ()))
            self._client_info = (self._info, brief)
        return self._client_info[1]

    def current(self, packed: bool = False) -> Tuple[int, bytes]:
        """(generation, the state blob it started from); ``packed``: the blob packed
        (``pl_state_pack``; ``_core.state_unpack`` gives it back), ~20x smaller at many
        sources (a blob holds every source's name, path and counters): what the
        callers take, since Ray keeps memory in the receiving process in proportion to
        a reply's size."""
        self._ensure()
        if not packed:
            return self._gen, self._start_blob
        return self._gen, self._packed_start()

    def _packed_start(self) -> bytes:
        """The generation's start blob, packed (made once per generation)."""
        if getattr(self, "_start_packed", (None, None))[0] is not self._start_blob:
            self._start_packed = (self._start_blob, _core.state_pack(self._start_blob))
        return self._start_packed[1]

    def resume_point(self, constructor: int) -> Tuple[int, bytes]:
        """(generation, state blob) a standby or restarted constructor stands at: the
        least step its ranks have not received as its last plan request reported
        (``need``), else the least step they reported standing at, else the
        generation's start, as near as kept."""
        self._ensure()
        c = int(constructor)
        low = self._low.get(c, max(self._start_step, self._ckpt_step))
        need = self._need.get(c, -1)
        for step in ([need] if need > low else []) + [low]:
            blob = self._state_at(step)
            if blob is not None:
                self._low[c] = low  # states kept from there until its ranks report more
                return self._gen, blob
        return self._gen, self._start_blob

    @ray.method(enable_task_events=False)
    def plan(self, gen: int, step: int, constructor: int, low: int = -1, need: int = -1):
        self._ensure()
        if gen != self._gen:
            return None  # stale: the constructor syncs first
        if low >= 0:
            self._low[constructor] = int(low)
        if need >= 0:
            self._need[constructor] = int(need)
        self._advance(step)
        if self._failure is not None and step >= self._failure[0]:
            raise self._failure[1]
        entry = self._cache.get(step)
        if entry is None and step < self._next_step:
            entry = self._replan(step)
        if entry is None:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"planner: step {step} is no longer kept (constructor {constructor}); "
                f"kept steps start at {min(self._cache) if self._cache else self._next_step}")
        self._fetched[constructor] = max(self._fetched.get(constructor, -1), step)
        if len(self._fetched) >= self._num_constructors:
            low = min(self._fetched.values())
            for s in [s for s in self._cache if s < low]:
                del self._cache[s]
        return entry

    @ray.method(enable_task_events=False)
    def plans(self, gen: int, step: int, constructor: int, count: int, low: int = -1,
              need: int = -1):
        """``plan`` for steps ``step .. step+count-1`` (stopping after train_steps, or
        before a step that fails), in one call; None for another generation.  ``low``:
        the least step a rank of the constructor stands at (states before it go);
        ``need``: the least step a rank of it has not received (``resume_point``)."""
        out = []
        for s in range(int(step), int(step) + max(1, int(count))):
            try:
                entry = self.plan(gen, s, constructor, low, need)
            except polyload.PolyloadError:
                if not out:
                    raise
                break
            if entry is None:
                return None
            out.append(entry)
            if entry[1] is None:
                break
        return out

    @ray.method(enable_task_events=False)
    def state(self, gen: int, step: int) -> bytes:
        """The packed (``pl_state_pack``) state blob of ``step``'s start in generation ``gen``
        (-1: the current one).  Raises StateError for another generation or a step no
        longer kept (more than ``keep_steps`` behind the newest planned step)."""
        self._ensure()
        if gen >= 0 and gen != self._gen:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"planner: the deployment was restarted from another state (generation "
                f"{self._gen}, asked for {gen}); call load_state_dict")
        step = int(step)
        if step >= self._next_step:
            self._advance(step)
        z = self._states.get(step)
        if z is None:
            if self._failure is not None and step >= self._failure[0]:
                raise self._failure[1]
            kept = (f"{min(self._states)}..{max(self._states)}" if self._states else "none")
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"planner: the state of step {step} is no longer kept (kept steps {kept}; "
                f"a rank more than {self._keep} steps behind the deployment)")
        return z

    def memory(self) -> Dict[str, int]:
        """What the planner keeps: ``{"states_kept", "states_bytes" (packed),
        "keep_steps", "plans_kept", "checkpoints", "checkpoint_bytes" (written to the
        store), "next_step", "recovered_from" (-1: never restarted)}``."""
        self._ensure()
        return {"states_kept": len(self._states),
                "states_bytes": sum(len(z) for z in self._states.values()),
                "keep_steps": self._keep, "plans_kept": len(self._cache),
                "checkpoints": self.checkpoints, "checkpoint_bytes": self.checkpoint_bytes,
                "next_step": self._next_step,
                "recovered_from": getattr(self, "recovered_from", -1)}

    def forget(self) -> None:
        """Delete the checkpoint from the store (at shutdown)."""
        if getattr(self, "_kv_key", None):
            _kv_del(self._kv_key)

    def restart(self, blob: bytes, force: bool = False) -> Tuple[int, bytes]:
        """Continue the deployment from a state blob: a new generation, unless ``blob``
        is the one the current generation started from and no constructor has planned
        more than ``max_lag_steps`` steps past it (several ranks loading the same state
        restart the deployment once; a rank loading it later joins while its start is
        still kept).  Raises StateError as the embedded loader."""
        self._ensure()
        blob = bytes(blob)
        h = hashlib.sha256(blob).digest()
        if (not force and h == self._start_hash
                and self._next_step - self._start_step <= self._max_lag):
            return self._gen, self._start_blob
        before = self._planner.get_state()
        try:
            self._planner.set_state(blob)  # corrupt blob or fingerprint: StateError
        except BaseException:
            self._planner.set_state(before)
            raise
        self._gen += 1
        self._start_blob = blob
        self._start_hash = h
        self._reset_cache(_core.state_info(blob)["step"])
        self._ckpt_step, self._ckpt_blob = -1, None
        self._persist()
        return self._gen, self._start_blob

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self._planner = None


# ================================================================= source loader


class SourceLoader:
    """Payloads of index-range partitions of sources: ``shards`` is a list of
    ``(source index, first document, end document)``.  ``read(reads)`` takes an int64
    array ``[n, 4]`` of ``(source, index, offset, count)`` (rows of one source
    together) and returns one uint8 array per run of rows of one source: their tokens
    back to back at that source's stored width (with image-text sources in the config:
    one ``pl_reply_encode`` reply, see ``_read_reply``)."""

    def __init__(self, payload, cwd: str, shards: Sequence[Tuple[int, int, int]],
                 watch: Optional[str] = None) -> None:
        self._payload, self._cwd = payload, cwd
        self._shards = [tuple(int(x) for x in s) for s in shards]
        if watch:
            # Started by the autoscaler, detached so that it does not die with the
            # autoscaler's process (Ray kills the actors an actor owns with it): it
            # leaves by itself once its deployment's planner is gone for good.
            threading.Thread(target=self._watch, args=(watch,), daemon=True,
                             name="polyload-watch").start()
        self._sources: Dict[int, Any] = {}
        self._ready = False
        self._setup_lock = threading.Lock()  # reads run on two threads

    def _ensure_ready(self) -> None:
        """Set up on the first call after Ray restarted the actor (its process died)."""
        if not self._ready:
            with self._setup_lock:
                if not self._ready:
                    self.setup()

    def _watch(self, planner: str, every: float = 2.0) -> None:
        ctx = ray.get_runtime_context()
        namespace = ctx.namespace
        missing = 0
        while True:
            time.sleep(every)
            try:
                ray.get_actor(planner, namespace=namespace)
                missing = 0
            except ValueError:  # the name is gone: the deployment was shut down or lost
                missing += 1
                if missing >= 3:
                    ray.kill(ctx.current_actor, no_restart=True)
                    return
            except Exception:  # noqa: BLE001 - the GCS is busy: look again later
                pass

    def setup(self, fresh: bool = False, standby: bool = False) -> Dict[str, Any]:
        """Open the partitions' sources.  Also run by the first read after Ray
        restarted the actor (its process died): a loader holds no progress, only its
        partitions, which it keeps in Ray's internal KV store (the autoscaler changes
        them), so a restarted loader serves what it served before its death.
        ``fresh``: a new actor (launch, a scale-up): the partitions given win.
        ``standby``: a warm standby (shadow) that serves no read until its primary is
        lost: once its sources are open (and checked) it gives back their mapped index
        pages (``Source.release_pages``) and unloads their tokenizers
        (``Source.release_tokenizer``); the first reads after a take-over fault the
        pages in again from the page cache, and its first tokenization of a source
        loads that source's tokenizer again (tens of ms for a 2 MB tokenizer.json)."""
        self._standby = bool(standby)
        # Tokenizers run on this actor's threads (a lengths or read call tokenizes on
        # the calling thread; max_concurrency 2) and the deployment scales with
        # actors: Hugging Face tokenizers' own thread pool (rayon) would add threads
        # whose heaps keep ~7 MiB more per source (bench/README.md, issue 10).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # ... and on a pool of threads, each tokenizer file always on the same one, as
        # many as the CPUs the actor asked Ray for (at least 1), so that the CPU it
        # uses is the CPU it requested: a tokenizer used from several threads keeps
        # ~5 MiB more heap per source.  fastokens' own pool is held to the same count.
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
        threads = max(1, int(round(cpus)))
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        _core.set_tokenize_threads(threads)
        enter_cwd(self._cwd)
        ctx = ray.get_runtime_context()
        self._kv_key = f"polyload:{ctx.namespace}:{ctx.get_actor_name()}.shards".encode()
        saved = None if fresh else _kv_get(self._kv_key)
        if saved is not None:
            self._shards = [tuple(int(x) for x in t) for t in saved]
        cfg = make_config(self._payload)
        self._cfg = cfg
        self._srcs: List[Any] = [None] * cfg.num_sources
        # cost profile (the autoscaler's input): per source, wall seconds in calls,
        # rows, tokens, bytes; the process's CPU seconds are split by wall share
        self._prof_lock = threading.Lock()
        # [source, (busy_s, rows, tokens, bytes, calls, read_cpu_s, tokenized)], float64
        # (counts stay exact below 2**53); a row with calls == 0 is a source not served
        self._prof = np.zeros((cfg.num_sources, 7), dtype=np.float64)
        self._t_start = time.monotonic()
        self._cpu_start = time.process_time()
        self._busy = 0.0
        self._read_cpu = 0.0  # thread CPU seconds of reads so far
        self._set_shards(self._shards)
        # Image-text sources in the config: reads are answered as C replies (below).
        self._images = cfg.get_int("image_sources") > 0
        self._ready = True
        return {"pid": os.getpid(), "node_id": _node_id(), "shards": self._shards,
                "actor": ray.get_runtime_context().get_actor_name()}

    def _set_shards(self, shards) -> None:
        shards = [tuple(int(x) for x in s) for s in shards]
        for s, lo, hi in shards:
            if self._srcs[s] is None:
                self._srcs[s] = self._cfg.open_source(s)
                if getattr(self, "_standby", False):
                    # opened and checked (the tokenizer loaded once); until a
                    # take-over the standby holds neither pages nor tokenizer: the
                    # first tokenization loads it again (pl_source_release_tokenizer)
                    self._srcs[s].release_pages()
                    self._srcs[s].release_tokenizer()
        # Partitions as disjoint intervals of the key (source << 40 | index), sorted
        # (while the autoscaler moves a partition, old and new ones overlap).
        parts: List[List[int]] = []
        for a, b in sorted((s << _KEY_SHIFT | lo, s << _KEY_SHIFT | hi) for s, lo, hi in shards):
            if parts and a <= parts[-1][1]:
                parts[-1][1] = max(parts[-1][1], b)
            else:
                parts.append([a, b])
        lo = np.asarray([p[0] for p in parts], dtype=np.int64)
        hi = np.asarray([p[1] for p in parts], dtype=np.int64)
        self._parts, self._shards = (lo, hi), shards  # read() sees old or new, whole
        _kv_put(self._kv_key, pickle.dumps(shards, protocol=5))

    def set_shards(self, shards: Sequence[Tuple[int, int, int]]) -> Dict[str, Any]:
        """Serve these partitions from now on (the autoscaler moves, splits and merges
        partitions; it adds a partition here before routing reads to it and removes one
        after every reader has stopped using it).  Opens sources not open yet."""
        self._ensure_ready()
        self._set_shards(shards)
        return {"pid": os.getpid(), "node_id": _node_id(), "shards": self._shards}

    def _account(self, rows: np.ndarray, tokens: np.ndarray, nbytes: int, wall: float,
                 cpu: float, delivered: bool = True,
                 ns: Optional[np.ndarray] = None) -> None:
        """Add one call to the cost profile, split over its sources: wall seconds, rows,
        tokens (delivered by reads, or tokenized by lengths calls), bytes and, for
        reads, the reading thread's CPU seconds.  Wall and CPU go by each source's
        share of the call's time measured in C (``ns``: nanoseconds per source index,
        from ``read_rows_reply``) when given, else by its share of the tokens; bytes
        by the tokens."""
        srcs = np.unique(rows).tolist()
        total = float(tokens.sum()) or 1.0
        t_total = float(ns[srcs].sum()) if ns is not None else 0.0
        with self._prof_lock:
            self._busy += wall
            for s in srcs:
                sel = rows == s
                tok = float(tokens[sel].sum())
                share = tok / total if len(srcs) > 1 else 1.0
                tshare = float(ns[s]) / t_total if t_total > 0 else share
                p = self._prof[int(s)]
                p[0] += wall * tshare
                p[1] += int(sel.sum())
                p[3] += int(nbytes * share)
                p[4] += 1
                if delivered:
                    p[2] += int(tok)
                    p[5] += cpu * tshare
                else:
                    p[6] += int(tok)

    @ray.method(enable_task_events=False)  # the autoscaler asks every interval_s
    def profile(self) -> Dict[str, Any]:
        """The measured cost profile since the actor started (counters; the autoscaler
        takes differences): ``{"cpu_s": CPU seconds of the process, "read_cpu_s": of
        which reads (their thread's ``time.thread_time``: the C read runs in it),
        "wall_s": seconds alive, "busy_s": seconds in calls, "read_split": "time"
        (with image sources: a read of several sources splits its CPU by the time C
        measured for each) or "tokens" (token-only: by tokens), "sources": {source
        index: {"busy_s",
        "rows", "tokens" (delivered by reads), "tokenized" (tokens of the lengths calls:
        raw text tokenized here), "bytes", "calls", "read_cpu_s", "tokenize_cpu_s" (CPU
        seconds of the threads that tokenized the source's documents here, measured in
        C: ``Source.tokenize_cpu_s``)}}}``.  The rest of the process's CPU time is Ray's
        and Python's own (calls, serialization, these profiles)."""
        if not self._ready:
            return {"cpu_s": 0.0, "read_cpu_s": 0.0, "wall_s": 0.0, "busy_s": 0.0,
                    "sources": {}, "shards": self._shards}
        with self._prof_lock:
            cpu = time.process_time() - self._cpu_start
            busy, read_cpu = self._busy, self._read_cpu
            seen = np.flatnonzero(self._prof[:, 4] > 0)
            per = self._prof[seen].tolist()
        tkz_cpu = [self._srcs[s].tokenize_cpu_s if self._srcs[s] is not None else 0.0
                   for s in seen.tolist()]
        return {"cpu_s": cpu, "read_cpu_s": read_cpu,
                "wall_s": time.monotonic() - self._t_start, "busy_s": busy,
                "shards": self._shards, "pid": os.getpid(),
                "read_split": "time" if self._images else "tokens",
                "sources": {s: {"busy_s": v[0], "rows": int(v[1]), "tokens": int(v[2]),
                                "bytes": int(v[3]), "calls": int(v[4]), "read_cpu_s": v[5],
                                "tokenized": int(v[6]), "tokenize_cpu_s": c}
                            for s, v, c in zip(seen.tolist(), per, tkz_cpu)}}

    @ray.method(enable_task_events=False)
    def read(self, reads: np.ndarray) -> np.ndarray:
        """The rows' tokens back to back at their sources' stored widths (uint8)."""
        self._ensure_ready()
        reads = np.ascontiguousarray(reads, dtype=np.int64).reshape(-1, 4)
        key = reads[:, 0] << _KEY_SHIFT | reads[:, 1]
        lo, hi = self._parts
        i = np.searchsorted(lo, key, side="right") - 1
        ok = (i >= 0) & (key < hi[np.maximum(i, 0)]) if len(lo) else np.zeros(len(key), bool)
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise polyload.RangeError(
                _core.ERANGE, "ERANGE",
                f"source loader {ray.get_runtime_context().get_actor_name()}: document "
                f"{int(reads[j, 1])} of source {int(reads[j, 0])} is outside its partitions "
                f"{self._shards}")
        self._standby = False  # serving: a standby took over
        # With images, a call that reads several sources is timed per source in C and
        # its CPU split by those times (the decodes are not charged to the tokens read
        # beside them).  Token-only calls are split by tokens: copying tokens costs
        # about the same per token for every source, and a clock reading per change of
        # source was 4-11 % of such a call when sources alternate row by row.
        ns = np.zeros(len(self._srcs), np.int64) if self._images and len(reads) and \
            (reads[:, 0] != reads[0, 0]).any() else None
        t0, c0 = time.monotonic(), time.thread_time()
        if self._images:
            out = self._read_reply(reads, ns)
            cpu = time.thread_time() - c0
            with self._prof_lock:
                self._read_cpu += cpu
            self._account(reads[:, 0], reads[:, 3], len(out), time.monotonic() - t0, cpu,
                          ns=ns)
            return out
        data, _offsets = _core.read_rows_raw(self._srcs, reads)
        cpu = time.thread_time() - c0
        with self._prof_lock:
            self._read_cpu += cpu
        self._account(reads[:, 0], reads[:, 3], len(data), time.monotonic() - t0, cpu)
        return np.frombuffer(data, dtype=np.uint8)

    def _read_reply(self, reads: np.ndarray, ns: Optional[np.ndarray] = None) -> np.ndarray:
        """The reply of a deployment with image-text sources (``pl_reply_encode``, one C
        call): the rows' tokens at stored width plus the image of every row that holds a
        sample's placeholder run, decoded and resized here (the sample-level work of a
        source loader); a bad image travels as its error, which the micro-batch that
        needs it reports.  Parsed by the constructor in C (``complete_replies``)."""
        return np.frombuffer(_core.read_rows_reply(self._srcs, reads, ns), dtype=np.uint8)

    @ray.method(enable_task_events=False)
    def lengths(self, source: int, indices: List[int]):
        """Lengths of documents of a raw text source, tokenized here in batches (the
        tokens stay for the constructors' reads): ``(lengths, {position: message})``, a
        bad document's length being its negative PL_E* code."""
        self._ensure_ready()
        src = self._srcs[int(source)]
        t0 = time.monotonic()
        lens = src.lengths(indices)
        self._account(np.full(len(lens), int(source), np.int64),
                      np.maximum(np.asarray(lens, dtype=np.int64), 0), 0,
                      time.monotonic() - t0, 0.0, delivered=False)
        msgs = {}
        for j, v in enumerate(lens):
            if v < 0:
                try:
                    src.document_length(indices[j])
                except polyload.PolyloadError as e:
                    msgs[j] = e.message
        return lens, msgs

    @ray.method(enable_task_events=False)  # once per source: no record per source in the GCS
    def calibrate(self, source: int, count: int = 32, seed: int = 0) -> Dict[str, float]:
        """Measure a source's cost before any traffic (the autoscaler sizes pools of
        sources the schedule has not used yet): tokenize (raw text) and read ``count``
        documents of this loader's partitions of it, picked at random.  ``{"cpu_s",
        "tokens", "docs"}``: CPU seconds of the process (its tokenizing threads
        included) for those tokens."""
        self._ensure_ready()
        src = self._srcs[int(source)]
        mine = [(lo, hi) for s, lo, hi in self._shards if s == int(source)]
        if src is None or not mine:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"calibrate: source {source} is not held here")
        rng = np.random.default_rng(seed)
        docs = sorted({int(rng.integers(lo, hi)) for lo, hi in mine for _ in range(count)})
        docs = docs[:count]
        c0 = time.process_time()
        lens = [max(0, int(x)) for x in src.lengths(docs)]
        reads = np.asarray([[int(source), d, 0, n] for d, n in zip(docs, lens) if n > 0],
                           dtype=np.int64).reshape(-1, 4)
        srcs = [None] * len(self._srcs)
        srcs[int(source)] = src
        if len(reads):  # as read() answers: with images decoded where there are any
            (_core.read_rows_reply if self._images else _core.read_rows_raw)(srcs, reads)
        return {"cpu_s": time.process_time() - c0, "tokens": float(sum(lens)),
                "docs": float(len(docs))}

    def tokenizers(self) -> Dict[int, Optional[Dict[str, Any]]]:
        """Per source held: its tokenizer (``Source.tokenizer_state``: ``{"loaded",
        "loads", "shared_by"}``, None for a source without one).  A standby holds none
        loaded until it takes over; sources of one tokenizer file share one."""
        self._ensure_ready()
        return {s: src.tokenizer_state() for s, src in enumerate(self._srcs)
                if src is not None}

    def num_tokenized(self) -> Dict[int, int]:
        """Documents tokenized so far, per source held (raw text sources)."""
        self._ensure_ready()
        return {s: src.num_tokenized for s, src in enumerate(self._srcs) if src is not None}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass  # the sources close with the process


# ============================================================= data constructor


class DataConstructor:
    """Serves the DP ranks ``dp_ranks`` and every global rank with those DP ranks (TP,
    PP and CP peers): ``fetch(gen, rank, step)`` returns the package of ``rank``'s DP
    rank for ``step`` (a uint8 array, owned by the caller), or for step train_steps its
    state blob; the trainer expands it in C.

    Work is decided by the C pipeline (``pl_pipeline_get_work``): at most
    ``prefetch_steps`` steps are built ahead of the slowest attached rank, a rank more
    than ``max_lag_steps`` behind its group's lead is dropped (it alone gets LagError),
    so memory is bounded whatever the ranks do.  ``drivers`` coroutines fetch plans
    from the planner and payloads from the source loaders (one read per DP rank and
    step, whatever the TP/PP/CP fan-out).
    """

    def __init__(self, payload, cwd: str, index: int, dp_ranks: Sequence[int],
                 planner: str, loaders: Sequence[Sequence[str]], routing, dtypes: Sequence[int],
                 namespace: str, prefetch_steps: int, max_lag_steps: int,
                 drivers: int = 1, read_timeout: float = 30.0, standby: bool = False,
                 group: Sequence[str] = ()) -> None:
        self._payload, self._cwd = payload, cwd
        # A standby (shadow) builds its C objects at launch and serves nothing until
        # its first fetch: then it stands where its group's trainers are and rebuilds.
        self._standby = bool(standby)
        self._serving = False
        # bumped at each take-over and stand-down: a fetch started in an earlier term
        # raises StoodDown rather than answer from a pipeline it no longer owns
        self._term = 0
        # per rank: the most moves its Client had made (fetch's ``switches``) at a call
        # here, and that figure when this one last stood down: a call not from a later
        # move than that is one the client abandoned (it moved away meanwhile)
        self._seen_switches: Dict[int, int] = {}
        self._stood_switches: Dict[int, int] = {}
        # (time, actor name) of this one's last take-over: of two that take over at
        # once, the later stays (stand_down compares), so they never stand each
        # other down; and the name of the one serving since this one stood down
        self._epoch: Tuple[float, str] = (0.0, "")
        self._serving_peer: Optional[str] = None
        self._group_names = list(group)  # this group's constructors: primary, standbys
        self._index = int(index)
        self._dp_ranks = [int(d) for d in dp_ranks]
        # per source-loader slot: the primary's name, then its standbys' (shadows)
        self._planner_name = planner
        self._loader_names = [[n] if isinstance(n, str) else list(n) for n in loaders]
        self._read_timeout = float(read_timeout)
        self._ready = False
        self._recovered = False
        #: when a standby or restarted constructor started serving, and from which step
        self.activated: Optional[Dict[str, Any]] = None
        self.failovers: Any = collections.deque(maxlen=1000)  # the last moves of reads
        # per source: (partition starts, actor index per partition); None: the
        # planner's table (launch passes none: creation arguments are kept by Ray in
        # the GCS and in every process holding a handle to this actor, the trainers'
        # clients included, and these lists grow with the sources)
        self._routing = routing
        self._dtypes = np.asarray(dtypes, dtype=np.int64)
        self._widths = np.asarray([_WIDTH[int(d)] for d in dtypes], dtype=np.int64)
        self._namespace = namespace
        self._prefetch_steps = max(1, int(prefetch_steps))
        self._max_lag = int(max_lag_steps)
        self._n_drivers = max(1, int(drivers))
        self._max_units = 256  # units built together (one read per loader actor)
        self._n_batches = self._n_units = 0
        self._waiting = 0          # fetches blocked on a unit not built yet
        self._plans: Dict[int, Tuple[Optional[bytes], Optional[bytes]]] = {}
        self._tasks: List[asyncio.Task] = []
        self._closed = False
        self._setup_lock = asyncio.Lock()

    async def setup(self, recovering: bool = False) -> Dict[str, Any]:
        """Build the C objects and, for a primary at launch, stand at the deployment's
        position.  A standby (``standby``), or an actor Ray restarted after its process
        died (``recovering``: run by its first call), only builds them: its first fetch
        activates it (``_ensure_active``), standing at the least step its group's ranks
        still need as reported to the planner and rebuilding from there (plans are
        deterministic), so clients ask again only for what they did not receive."""
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        self._nmb = cfg.get_int("micro_batches_per_rank")
        self._train_steps = cfg.get_int("train_steps")
        self._images = cfg.get_int("image_sources") > 0  # reads come as C replies
        infos = [cfg.rank_info(r) for r in range(cfg.world_size())]
        self._ranks = [i["rank"] for i in infos if i["dp_rank"] in self._dp_ranks]
        self._pipe = _core.Pipeline.create(
            cfg, ranks=self._ranks, group_by_cp=False, unit=self._nmb,
            prefetch=self._prefetch_steps * self._nmb, max_lag_steps=self._max_lag)
        self._planner = ray.get_actor(self._planner_name, namespace=self._namespace)
        self._handles: Dict[str, Any] = {}
        self._rt_version = 0
        self._reads_inflight: Dict[int, int] = {}
        self._drain = asyncio.Condition()
        self._wait_s = 0.0  # seconds fetches waited for a package not built yet
        self._waits_now: Dict[object, float] = {}  # waits going on: their start
        self._trainer_wait: Dict[int, float] = {}  # rank -> its trainer's data wait so far
        self._n_fetches = 0
        self._n_at = 0  # DataConstructor.at calls received
        self._built_step = -1
        rt = await self._planner.routing.remote()
        if rt is not None and (rt.get("version", 0) > 0 or self._routing is None):
            # scaled since launch, or the launch's table (set before any constructor)
            self._apply_routing(rt["version"], *routing_for_constructors(rt))
        else:
            self._apply_routing(0, self._routing, self._loader_names)
        self._routing = None  # as compact arrays from here on (_pstart, _powner)
        # Three wake-ups, so that nobody wakes for what it does not wait for:
        # units built or steps added (consumers), room or demand (drivers), a
        # rank's cursor moved (its next fetch, which serves steps in order).
        self._built = asyncio.Condition()
        self._demand = asyncio.Condition()
        self._served = asyncio.Condition()
        self._reset_lock = asyncio.Lock()
        self._gen = -1
        self._final: Optional[bytes] = None
        self._cursor: Dict[int, int] = {}
        self._consumed: Dict[int, int] = {}
        self._have: Dict[int, int] = {}
        self._peer_warm: List[Any] = []
        if not (recovering or self._standby):
            gen, z = await self._planner.current.remote(True)
            blob = _core.state_unpack(z)
            await self._reset(gen, blob)
            self._serving = True
        else:  # connect to the source loaders now, not at the first read after a failure
            try:
                await asyncio.wait_for(asyncio.gather(
                    *[h.pid.remote() for h in self._handles.values()],
                    return_exceptions=True), 10.0)
            except asyncio.TimeoutError:
                pass
        self._ready = True
        return {"pid": os.getpid(), "node_id": _node_id(), "ranks": self._ranks,
                "serving": self._serving}

    async def warm(self) -> int:
        """Build the C objects now (a restarted actor becomes a warm standby); its pid."""
        await self._ensure_ready()
        return os.getpid()

    async def _ensure_active(self) -> None:
        """A standby or restarted constructor starts serving: the routing table and
        the position (``Planner.resume_point``: the least step its ranks still need)
        come from the planner; then it warms the other constructors of its group, so
        that the one lost becomes this one's standby once Ray has restarted it."""
        await self._ensure_ready()
        if self._serving:
            return
        async with self._setup_lock:
            if self._serving:
                return
            t0 = time.monotonic()
            rt, (gen, blob) = await asyncio.gather(self._planner.routing.remote(),
                                                   self._planner.resume_point.remote(self._index))
            if rt is not None and rt.get("version", 0) > self._rt_version:
                self._apply_routing(rt["version"], *routing_for_constructors(rt))
            self._recovered = True
            await self._reset(gen, blob)
            self._serving = True
            self._term += 1
            me = ray.get_runtime_context().get_actor_name()
            self._epoch = (time.time(), me)
            self._serving_peer = None
            self.activated = {"step": _core.state_info(blob)["step"], "time": time.time(),
                              "standby": self._standby, "took_s": time.monotonic() - t0,
                              "first_package_s": None}
            self._activated_t0 = t0
        for n in self._group_names:
            if n != me:
                self._peer_warm.append(asyncio.ensure_future(self._warm_peer(n)))

    async def _warm_peer(self, name: str) -> None:
        """Make a peer of the group this one's standby: built (a restarted actor), and
        no longer serving (a peer that was stalled, not lost, still believed it served:
        clients that come back to it later must find it standing at the resume point,
        not at the step it stopped at)."""
        try:
            h = ray.get_actor(name, namespace=self._namespace)
            await asyncio.wait_for(h.stand_down.remote(self._epoch), 120.0)
        except Exception:  # noqa: BLE001 - gone for good, or still restarting: its
            pass           # first call builds it then

    async def stand_down(self, epoch: Optional[Sequence[Any]] = None) -> int:
        """Another constructor of the group took over (``epoch``: its ``(time, actor
        name)`` then): stop serving (drivers stopped, fetches in flight raise
        StoodDown naming it, so their clients move there); the next fetch activates
        this one again at the resume point (``_ensure_active``).  One that took over
        later than ``epoch`` stays (two taking over at once: the later one serves).
        A warm standby after this call; its pid."""
        await self._ensure_ready()
        async with self._setup_lock:
            ep = (float(epoch[0]), str(epoch[1])) if epoch is not None else None
            if self._serving and (ep is None or ep > self._epoch):
                self._serving = False
                self._serving_peer = ep[1] if ep is not None else None
                self._term += 1
                self._stood_switches = dict(self._seen_switches)
                for t in self._tasks:
                    t.cancel()
                self._tasks = []
                await self._notify()
        return os.getpid()

    def _apply_routing(self, version: int, routing, slot_names) -> None:
        """Route reads by ``routing`` (per source: partition starts, slot per
        partition); ``slot_names[slot]``: the slot's actor, then its standbys.  Slots
        are only ever appended, so a read in flight keeps a valid slot index."""
        self._loader_names = [[n] if isinstance(n, str) else list(n) for n in slot_names]
        # handles of slots that serve (a retired slot has no names: no lookups)
        old_active = getattr(self, "_active", [])
        self._loaders = []
        for names in self._loader_names:
            hs = []
            for n in names:
                if n not in self._handles:
                    self._handles[n] = ray.get_actor(n, namespace=self._namespace)
                hs.append(self._handles[n])
            self._loaders.append(hs)
        # which candidate of each slot serves
        self._active = [old_active[j] if j < len(old_active) else 0
                        for j in range(len(self._loaders))]
        keys = [(s << _KEY_SHIFT | int(lo), int(a)) for s, (los, owners) in
                enumerate(routing) for lo, a in zip(los, owners)]
        keys.sort()
        self._pstart = np.asarray([k for k, _ in keys], dtype=np.int64)
        self._powner = np.asarray([a for _, a in keys], dtype=np.int64)
        self._rt_version = int(version)

    async def set_routing(self, table: Dict[str, Any]) -> int:
        """Route reads by a new table of the autoscaler (``Planner.set_routing``'s
        dict); returns once no read routed by an older table is in flight, so the
        autoscaler may then retire the actors the new table no longer names."""
        await self._ensure_ready()
        if int(table["version"]) > self._rt_version:
            self._apply_routing(int(table["version"]), *routing_for_constructors(table))
        async with self._drain:
            while any(n for v, n in self._reads_inflight.items() if v < self._rt_version):
                await self._drain.wait()
        return self._rt_version

    @ray.method(enable_task_events=False)  # the autoscaler asks every interval_s
    async def load(self) -> Dict[str, Any]:
        """What the autoscaler's feedback reads: ``{"wait_s": seconds fetches waited for
        packages not built yet (waits still going on included), "fetches",
        "queue_steps": steps built ahead of the least-advanced served rank, "version":
        routing version, "pid", "consumed": the least step a served trainer reported
        standing at, "trainer_wait_s": the served trainers' own data wait
        (``Client.data_wait_s`` as their last fetch reported it), "trainer_ranks": how
        many reported}``.  ``wait_s`` (the Client's fetches, which run ahead of the
        trainer by its prefetch) is an upper bound of the trainers' wait; the autoscaler
        uses the trainers' own figure when they report it.  ``"serving"``: False for a standby
        not serving yet (its figures are zero)."""
        await self._ensure_ready()
        low = min(self._cursor.values()) if self._cursor else 0
        now = time.monotonic()
        ongoing = sum(now - t0 for t0 in self._waits_now.values())  # waits not over yet
        return {"wait_s": self._wait_s + ongoing, "fetches": self._n_fetches,
                "pid": os.getpid(), "trainer_wait_s": sum(self._trainer_wait.values()),
                "consumed": min(self._consumed.values()) if self._consumed else -1,
                "trainer_ranks": len(self._trainer_wait),
                "queue_steps": max(0, self._built_step + 1 - low),
                "version": self._rt_version, "time": time.monotonic(),
                "serving": self._serving, "activated": self.activated}

    async def _ensure_ready(self) -> None:
        if not self._ready:
            async with self._setup_lock:
                if not self._ready:
                    await self.setup(recovering=True)

    # ------------------------------------------------------------ generations

    async def _reset(self, gen: int, blob: bytes) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - cancelled or failed: replaced
                pass
        self._pipe.reset(blob)
        self._gen = gen
        self._final = None
        self._plans = {}
        self._cursor = {r: _core.state_info(blob)["step"] for r in self._ranks}
        # the step each rank's trainer stands at, and the first it has not received
        # (reported by its fetches)
        self._consumed = dict(self._cursor)
        self._have = dict(self._cursor)
        # the step each rank's trainer reached a step boundary at (``at``): where a
        # client started again for the rank continues (``rejoin``)
        self._at = dict(self._cursor)
        self._recent: Dict[int, Dict[int, Any]] = {}
        self._last_call: Dict[int, Tuple[int, int, int, int]] = {}
        self._tasks = [asyncio.ensure_future(self._drive(gen)) for _ in range(self._n_drivers)]
        await self._notify()

    async def sync(self, gen: int, rank: Optional[int] = None):
        """Follow the planner to generation ``gen`` (after a restart from a state).
        With ``rank``: ``(generation, the step rank stands at here)``.  Peers that sync
        together reset the pipeline once."""
        await self._ensure_ready()
        if not self._serving:  # a standby follows when it takes over
            return self._gen if rank is None else (self._gen, -1)
        if gen > self._gen:
            async with self._reset_lock:
                if gen > self._gen:
                    g, z = await self._planner.current.remote(True)
                    blob = _core.state_unpack(z)
                    if g > self._gen:
                        await self._reset(g, blob)
        if rank is None:
            return self._gen
        return self._gen, self._cursor.get(int(rank), -1)

    @staticmethod
    async def _wake(cond: asyncio.Condition) -> None:
        async with cond:
            cond.notify_all()

    @staticmethod
    async def _sleep_on(cond: asyncio.Condition) -> None:
        async with cond:
            await cond.wait()

    async def _notify(self) -> None:
        for c in (self._built, self._demand, self._served):
            await self._wake(c)

    # --------------------------------------------------------------- drivers

    async def _drive(self, gen: int) -> None:
        pipe = self._pipe
        while not self._closed and gen == self._gen:
            try:
                w = pipe.get_work(3, 0)
            except polyload.PolyloadError:
                return  # closed or failed: the ranks get the error from the pipeline
            if w is None:
                await self._sleep_on(self._demand)
                continue
            if w == "done":
                return
            if w.kind == "plan":
                await self._plan(gen, w)
            else:
                units = [w]  # every unit that may be built now: one read per loader actor
                if self._waiting == 0:
                    # Nobody waits for a unit: let the other ranks' pending requests open
                    # their windows first, so that one read per loader actor serves them.
                    await asyncio.sleep(0)
                pending_plan = None
                while len(units) < self._max_units:
                    try:
                        more = pipe.get_work(3, 0)
                    except polyload.PolyloadError:
                        more = None
                    if more is None or more == "done":
                        break
                    if more.kind == "plan":  # a cached plan is added at once: more units
                        if not self._add_cached(more):
                            pending_plan = more
                            break
                        continue
                    units.append(more)
                await self._build(gen, units)
                if pending_plan is not None:
                    await self._plan(gen, pending_plan)
            if gen == self._gen:
                await self._wake(self._built)

    def _add_cached(self, w) -> bool:
        """Add step w.step if its plan was fetched already; False otherwise."""
        entry = self._plans.pop(w.step, None)
        if entry is None:
            return False
        blob, plan = entry
        if plan is None:
            self._final = blob
        self._pipe.add_step(w.step, plan, blob, w)
        return True

    async def _plan(self, gen: int, w) -> None:
        """Add step w.step, from plans fetched up to ``PLANS_PER_CALL`` at a time."""
        entry = self._plans.pop(w.step, None)
        if entry is None:
            try:
                # states are kept from the least step a rank stands at or may be
                # started again at (``at``: one step before its consumed position
                # when it stands at a step boundary, and reported late)
                keep = min(min(self._consumed.values()), min(self._at.values()))
                res = await self._planner.plans.remote(gen, w.step, self._index,
                                                       min(self._prefetch_steps,
                                                           PLANS_PER_CALL), keep,
                                                       min(self._have.values()))
            except Exception as e:  # noqa: BLE001 - the ranks that reach the step get it
                if gen == self._gen:
                    self._pipe.fail_step(w.step, *_error_parts(e))
                return
            if res is None or gen != self._gen:
                return  # the planner moved on: a sync follows
            for k, item in enumerate(res):
                self._plans[w.step + k] = item
            entry = self._plans.pop(w.step)
        blob, plan = entry
        if plan is None:
            self._final = blob
        self._pipe.add_step(w.step, plan, blob, w)  # dropped if a reset came meanwhile

    async def _build(self, gen: int, units) -> None:
        """Build units: their reads routed to the source-loader actors, one call per
        actor for all the units, then one package per unit (C)."""
        self._n_batches += 1
        self._n_units += len(units)
        try:
            per_unit = [np.asarray(u.reads()) for u in units]
            sizes = [len(r) for r in per_unit]
            reads = np.concatenate(per_unit) if per_unit else np.zeros((0, 4), np.int64)
            n = len(reads)
            key = reads[:, 0] << _KEY_SHIFT | reads[:, 1]
            owner = self._powner[np.searchsorted(self._pstart, key, side="right") - 1]
            order = np.argsort(owner, kind="stable")
            actors, starts = np.unique(owner[order], return_index=True)
            ends = np.append(starts[1:], n)
            ver = self._rt_version
            # the slots' actors of this table: a newer one applied before the reads
            # start (set_routing runs between gather and them) may retire a slot
            # these reads were routed to; its actors stay until they drain
            loaders, names = self._loaders, self._loader_names
            self._reads_inflight[ver] = self._reads_inflight.get(ver, 0) + 1
            try:
                outs = list(await asyncio.gather(*[
                    self._read(int(a), reads[order[st:en]], loaders[int(a)], names[int(a)])
                    for a, st, en in zip(actors, starts, ends)]))
            finally:
                self._reads_inflight[ver] -= 1
                if ver < self._rt_version:
                    await self._wake(self._drain)
            self._built_step = max([self._built_step] + [u.step for u in units])
        except Exception as e:  # noqa: BLE001 - the ranks that reach the units get it
            if gen == self._gen:
                for u in units:
                    self._pipe.fail(u, *_error_parts(e))
            return
        if gen != self._gen:
            return
        if self._images:
            self._complete_replies(units, sizes, outs, order, starts, ends, n)
            return
        read_buf = np.empty(n, dtype=np.int64)
        read_off = np.empty(n, dtype=np.int64)
        nbytes = reads[:, 3] * self._widths[reads[:, 0]]
        for j, (st, en) in enumerate(zip(starts, ends)):
            sel = order[st:en]
            nb = nbytes[sel]
            read_off[sel] = np.cumsum(nb) - nb
            read_buf[sel] = j
        read_dtype = self._dtypes[reads[:, 0]]
        at = 0
        for u, k in zip(units, sizes):
            try:
                self._pipe.complete(u, outs, read_dtype[at:at + k], read_buf[at:at + k],
                                    read_off[at:at + k])
            except Exception as e:  # noqa: BLE001
                self._pipe.fail(u, *_error_parts(e))
            at += k

    def _complete_replies(self, units, sizes, outs, order, starts, ends, n) -> None:
        """The packages of units whose reads came back as replies (image-text sources):
        read j is row ``read_row[j]`` of reply ``read_buf[j]``; C parses the replies and
        puts tokens and images into each package (``Pipeline.complete_replies``)."""
        read_buf = np.empty(n, dtype=np.int64)
        read_row = np.empty(n, dtype=np.int64)
        for j, (st, en) in enumerate(zip(starts, ends)):
            sel = order[st:en]
            read_buf[sel] = j
            read_row[sel] = np.arange(en - st, dtype=np.int64)
        at = 0
        for u, k in zip(units, sizes):
            try:
                self._pipe.complete_replies(u, outs, read_buf[at:at + k], read_row[at:at + k])
            except Exception as e:  # noqa: BLE001
                self._pipe.fail(u, *_error_parts(e))
            at += k

    async def _read(self, slot: int, rows: np.ndarray, cands=None, names=None):
        """One read of source-loader slot ``slot``, moved to its next standby when the
        serving actor is lost (killed, crashed, its node gone) or gives no answer within
        ``read_timeout`` (stalled).  A read holds no progress, so any replica gives the
        same bytes; Ray restarts a lost actor in the background and it becomes a standby
        again.  PolyloadIOError naming the slot's actors when every one failed."""
        if cands is None:  # the current table's
            cands, names = self._loaders[slot], self._loader_names[slot]
        if not cands:
            raise polyload.PolyloadIOError(
                _core.EIO, "EIO", f"constructor {self._index}: routing table v"
                f"{self._rt_version} sends a read to retired slot {slot}")
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

    # --------------------------------------------------------------- serving

    @ray.method(enable_task_events=False)
    async def fetch(self, gen: int, rank: int, step: int, count: int = 1,
                    timeout: float = 600.0, consumed: int = -1, have: int = -1,
                    waited: float = -1.0, switches: int = -1,
                    at: int = -1) -> Tuple[np.ndarray, np.ndarray, Optional[bytes],
                                           Optional[Tuple[int, str]]]:
        """The packages of ``rank``'s DP rank for steps ``step .. step+count-1`` (without
        state blobs; for step train_steps its state blob as bytes, and nothing after it),
        in one call: one object per call, owned by the caller, ``(packages, ends,
        final)`` (:func:`_pack_fetch`: the packages back to back in one uint8 array).
        When a step after the first fails (its build or its plan), the answer ends
        before it and has a fourth element, ``(code, message)`` of that step: the
        trainer gets the steps before it first, as from the embedded loader.
        ``consumed``: the step the rank's trainer stands at (the planner keeps states
        from the least of them); ``waited``: seconds the trainer has waited for batches
        so far (the autoscaler's feedback); ``have``: the first step the trainer has not received
        (after a restart of this actor, the steps before it are skipped for the rank).
        ``at``: the trainer finished every step before it (as :meth:`at`, carried by
        the fetch so that a trainer that fetches often needs no separate report).
        ``switches``: how many times the client moved between the group's constructors
        so far; a call to a constructor that stood down activates it again only when it
        comes from a later move than the rank's calls seen here (an older one was
        abandoned by the client, and is answered StoodDown).
        Raises the error of the call's first step; StateError (another generation)
        and LagError (the lag policy dropped the rank) at any step of the call (the
        call's steps before it then do not reach the trainer: it starts again or is
        dropped anyway)."""
        await self._ensure_ready()
        if not self._serving and 0 <= int(switches) <= self._stood_switches.get(int(rank), -1):
            raise StoodDown(f"constructor {self._index}: a call the client abandoned",
                            self._serving_peer)
        if switches > self._seen_switches.get(int(rank), -1):
            self._seen_switches[int(rank)] = int(switches)
        await self._ensure_active()
        if gen > self._gen:
            await self.sync(gen)
        term = self._term
        self._check_alive(term)
        if gen != self._gen:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"constructor {self._index}: the deployment was restarted from another "
                f"state (generation {self._gen}, this client has {gen}); call "
                f"load_state_dict")
        if rank not in self._cursor:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"constructor {self._index}: rank {rank} is not served here")
        if consumed > self._consumed[rank]:
            self._consumed[rank] = int(consumed)
        if have > self._have[rank]:
            self._have[rank] = int(have)
        if at > self._at.get(rank, at):
            self._at[rank] = int(at)
        if waited >= 0:  # the trainer's own data wait so far (Client.data_wait_s)
            self._trainer_wait[rank] = float(waited)
        self._last_call[rank] = (int(step), int(count), int(consumed), int(have))
        recent = self._recent.get(rank)
        if recent and have >= 0:
            # kept: what the trainer has not received, and what it received but has not
            # finished (a client started again for the rank continues there), within
            # the lag limit
            lo = max(min(int(have), self._at[rank]), int(have) - self._max_lag)
            for s in [s for s in recent if s < lo]:
                del recent[s]
        out: List[Any] = []
        err: Optional[Tuple[int, str]] = None
        deadline = asyncio.get_running_loop().time() + float(timeout)
        try:
            # Rebuilt from an earlier step than the trainer has: serve the rank what it
            # already has into the void (deterministic: the same packages).
            while self._recovered and 0 <= self._cursor[rank] < min(int(have), int(step)) \
                    and gen == self._gen:
                await self._fetch_one(gen, rank, self._cursor[rank], deadline, term)
            for s in range(int(step), int(step) + max(1, int(count))):
                again = self._recent.get(rank, {}).get(s) if s < self._cursor[rank] else None
                if again is not None:  # asked again after a call lost in our restart
                    out.append(again)
                else:
                    # each step gets the whole timeout: a call may carry hundreds
                    deadline = asyncio.get_running_loop().time() + float(timeout)
                    try:
                        pkg = await self._fetch_one(gen, rank, s, deadline, term)
                    except polyload.PolyloadError as e:
                        if not out or isinstance(e, (polyload.StateError,
                                                     polyload.LagError)):
                            raise
                        # A step after the first failed: the steps before it go to the
                        # trainer, and the error comes at this step, as in the
                        # embedded loader (not at the call's first step).
                        err = (int(e.code), str(e.message))
                        break
                    if pkg is None:  # restarted from another state while it waited
                        raise polyload.StateError(
                            _core.ESTATE, "ESTATE",
                            "polyload.ray: the deployment was restarted meanwhile")
                    out.append(pkg)
                if 0 <= self._train_steps <= s:
                    break
        finally:  # the window moved by len(out) steps: the drivers build them together
            await self._wake(self._demand)
            await self._wake(self._served)
        return _pack_fetch(out, err)

    @ray.method(num_returns=0, enable_task_events=False)
    async def at(self, gen: int, rank: int, step: int) -> None:
        """The trainer of ``rank`` finished every step before ``step`` (from its Client,
        no answer; the latest step at most once per ``_client.AT_INTERVAL_S``)."""
        self._n_at += 1
        if self._serving and gen == self._gen and step > self._at.get(rank, step):
            self._at[rank] = int(step)

    async def rejoin(self, gen: int, rank: int,
                     activate: bool = True) -> Optional[Tuple[int, int]]:
        """``(generation, step)`` a new Client of ``rank`` starts at: the first step the
        rank's trainer had not finished (``at``), whose packages are served again; the
        generation's start for a rank never served.  None from a standby that does not
        serve, unless ``activate`` (it then takes over, as at a fetch): a new client
        asks the serving one of its group, so that its start moves nobody."""
        await self._ensure_ready()
        if not (activate or self._serving):
            return None
        await self._ensure_active()
        if gen > self._gen:
            await self.sync(gen)
        if rank not in self._cursor:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"constructor {self._index}: rank {rank} is not served here")
        return self._gen, self._at[rank]

    async def _wait(self, cond: asyncio.Condition, what: str, deadline: float) -> None:
        """Wait on cond until the fetch's deadline: PolyloadTimeoutError naming the
        constructor and what it waited for."""
        left = deadline - asyncio.get_running_loop().time()
        try:
            async with cond:  # taken before anything can notify: no lost wake-up
                await asyncio.wait_for(cond.wait(), timeout=max(0.0, left))
        except asyncio.TimeoutError:
            raise polyload.PolyloadTimeoutError(
                _core.ETIMEDOUT, "ETIMEDOUT",
                f"constructor {self._index} ({ray.get_runtime_context().get_actor_name()}): "
                f"no {what} before the fetch's deadline") from None

    async def _fetch_one(self, gen: int, rank: int, step: int, deadline: float,
                         term: Optional[int] = None):
        if 0 <= self._train_steps <= step:
            while self._final is None and gen == self._gen:
                self._check_alive(term)
                await self._wake(self._demand)
                await self._wait(self._built, f"final state for step {step}", deadline)
            return self._final
        while self._cursor[rank] < step and gen == self._gen:  # in order per rank
            self._check_alive(term)
            await self._wait(self._served, f"turn of rank {rank} for step {step}", deadline)
        if self._cursor[rank] != step:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"constructor {self._index}: step {step} of rank {rank} was already served "
                f"(the rank stands at step {self._cursor[rank]}; kept for a retry: "
                f"{sorted(self._recent.get(rank, {}))}; last call (step, count, consumed, "
                f"have) {self._last_call.get(rank)}); "
                f"load a state to go back")
        while True:
            if gen != self._gen:
                raise polyload.StateError(_core.ESTATE, "ESTATE",
                                          "polyload.ray: the deployment was restarted meanwhile")
            self._check_alive(term)
            if self._cursor[rank] != step:
                # Another call of the rank took this step while this one waited (two
                # calls in flight, both rebuilding after a take-over): it is kept.
                kept = self._recent.get(rank, {}).get(step)
                if kept is not None:
                    return kept
                raise polyload.StateError(
                    _core.ESTATE, "ESTATE",
                    f"constructor {self._index}: step {step} of rank {rank} was served to "
                    f"another call meanwhile and is not kept (the rank stands at step "
                    f"{self._cursor[rank]})")
            try:
                res = self._pipe.next(rank, self._nmb, 0)
            except polyload.PolyloadTimeoutError:  # not built yet: woken by the drivers
                await self._wake(self._demand)  # the request may have opened the window
                self._waiting += 1
                t0 = time.monotonic()
                key = object()
                self._waits_now[key] = t0
                try:
                    await self._wait(self._built, f"package of rank {rank}, step {step}", deadline)
                finally:
                    self._waiting -= 1
                    del self._waits_now[key]
                    self._wait_s += time.monotonic() - t0
                continue
            break
        if res is None:
            return self._final
        self._n_fetches += 1
        if self.activated is not None and self.activated["first_package_s"] is None:
            self.activated["first_package_s"] = time.monotonic() - self._activated_t0
        data, got_step, _mb, _count = res
        self._cursor[rank] = got_step + 1
        pkg = np.frombuffer(data, dtype=np.uint8)
        # Until the client says it has them (fetch's `have`), served packages stay: a
        # call lost on the way (Ray: "may or may not have been executed") is asked again.
        self._recent.setdefault(rank, {})[got_step] = pkg
        return pkg

    async def failover_log(self) -> List[Dict[str, Any]]:
        """The reads this constructor moved to a standby source loader."""
        return list(self.failovers)

    def _check_alive(self, term: Optional[int] = None) -> None:
        if self._closed:
            raise polyload.PolyloadError(_core.ECLOSED, "ECLOSED",
                                         f"constructor {self._index} is closed")
        if term is not None and (term != self._term or not self._serving):
            raise StoodDown(f"constructor {self._index} "
                            f"({ray.get_runtime_context().get_actor_name()}) stood down: "
                            f"{self._serving_peer or 'another constructor of its group'} "
                            f"serves", self._serving_peer)

    async def position(self, activate: bool = False) -> Optional[Tuple[int, int, int]]:
        """``(generation, step, micro-batch)``: the position after the micro-batches
        delivered to every served rank (the deployment's view; a Client's own state
        is exact for its rank); None for a standby that does not serve, unless
        ``activate`` (it then takes over, as at a fetch)."""
        if activate:
            await self._ensure_active()
        await self._ensure_ready()
        if not self._serving:
            return None
        step, mb, _have = self._pipe.position()
        return self._gen, step, mb

    async def memory(self) -> Dict[str, int]:
        """``{"pipeline_bytes": pl_pipeline_sizeof, "rss_bytes": resident set size}``
        of this actor, to check that it stays bounded."""
        await self._ensure_ready()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"pipeline_bytes": int(self._pipe.sizeof()), "rss_bytes": rss,
                "build_batches": self._n_batches, "units_built": self._n_units,
                "at_calls": self._n_at}

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        self._closed = True
        self._pipe.stop()
        for t in self._tasks:
            t.cancel()
        await self._notify()
