"""The planner actor (``NAME.planner``): plans from metadata only, and the deployment's
registry of its position.

It opens the sources for their document lengths only and emits, per step, the encoded
plan (``pl_plan_encode``); it never reads a payload.  It keeps the state blob of each
step's start (packed, ``pl_state_pack``, for the steps some rank may still stand at),
which trainers fetch only when ``state_dict()`` or ``stats()`` need it: packages carry
no state, so the per-source part of the state is held once, not per rank and step.  It
also keeps the deployment's generation (the state it was last restarted from), its
layout (``info``) and the routing table, and writes a checkpoint of them to Ray's
key-value store, from which a restarted planner continues.  Raw text sources hold
lengths only here: the source loaders that own them (by the routing table) tokenize and
report the lengths.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from . import _registry
from ._calls import actor_lost, node_id, unwrap
from ._config import enter_cwd, make_config, sources_digest
from ._failure import has_failure_detection_env
from ._routing import RoutingTable

_WARM_DOCS = 1 << 15  # raw documents per source whose owners a scaling event may warm
_WARM_STEPS = 16  # steps after planning that a raw document's tokens may still be read


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
        self._kv_key = _registry.checkpoint_key(ctx.namespace, ctx.get_actor_name())
        saved = _registry.kv_get(self._kv_key)
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
            "node_id": node_id(),
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

    def set_routing(self, table: RoutingTable) -> None:
        """Which source loader owns which documents (before any plan is asked, and
        after each scaling event).  Kept in the checkpoint, so a restarted planner or
        autoscaler finds it; a newer version warms the raw text documents whose owner
        it changes (:meth:`_warm`)."""
        self._ensure()
        with self._inflight_lock:
            old = getattr(self, "_routing", None)
            self._routing = table
        self._persist()
        if old is not None and int(table.version) > int(old.version):
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

    def _warm(self, old: RoutingTable, new: RoutingTable) -> None:
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
            b = new.owner_of(source, idx)
            moved = old.owner_of(source, idx) != b
            for slot in np.unique(b[moved]).tolist():
                docs = idx[moved & (b == slot)].tolist()
                try:
                    h = ray.get_actor(new.slots[slot][0], namespace=new.namespace)
                    h.lengths.remote(int(source), docs)  # fire and forget
                    self.warmed += len(docs)
                except Exception:  # noqa: BLE001 - only a speed-up
                    pass

    def routing(self) -> Optional[RoutingTable]:
        """The routing table last set (None before launch sets one)."""
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
            version = info.version
            self._inflight[version] = self._inflight.get(version, 0) + 1
        try:
            return self._lengths_by(info, source, indices)
        finally:
            with self._inflight_lock:
                self._inflight[version] -= 1

    def _lengths_by(self, info: RoutingTable, source: int, indices: List[int]):
        with self._inflight_lock:
            log = self._fetch_log.get(source)
            if log is None:
                log = self._fetch_log[source] = collections.OrderedDict()
            for i in indices:
                log[int(i)] = None
            while len(log) > _WARM_DOCS:
                log.popitem(last=False)
        idx = np.asarray(indices, dtype=np.int64)
        owner = info.owner_of(source, idx)
        slots = info.slots
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

    def _handle(self, info: RoutingTable, name: str):
        h = self._loader_handles.get(name)
        if h is None:
            h = self._loader_handles[name] = ray.get_actor(name, namespace=info.namespace)
        return h

    def _lengths_answer(self, info: RoutingTable, names: List[str], ref, source: int,
                        docs: List[int]):
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
            f"{info.sources[source]} (tried {'; '.join(tried)})")

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
        _registry.kv_put(self._kv_key, data)
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
            _registry.kv_del(self._kv_key)

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
