"""The autoscaler actor (``NAME.autoscaler``): source loaders that scale with the work.

Batches never depend on the loaders: a read holds no progress and any loader holding a
partition answers the same bytes, so the autoscaler may split, merge and move index-range
partitions between actors at any step; it only changes the routing table
(:class:`~polyload.ray._routing.RoutingTable`: which slot owns which documents of which
source), in this order: start the new actors with their partitions open, give kept
actors the union of old and new partitions, publish the table to the planner and every
constructor (each answers once no read routed by an older table is in flight), then
shrink kept actors to their new partitions and retire the actors the table no longer
names.  A routing table is checked to cover every document of every source exactly once
before it is published.  It measures the deployment every ``interval_s`` (costs from the
source loaders' profiles, the trainers' wait from the constructors, the step from the
planner) and, when enabled, applies :class:`~polyload.ray._scale_policy.ScalePolicy`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import ray

from . import _registry
from ._calls import actor_lost, unwrap
from ._config import enter_cwd, make_config
from ._failure import with_failure_detection
from ._placement import LoaderPlacement, node_affinity
from ._routing import RoutingTable, split_ranges
from ._scale_policy import ScalePolicy, SourceView, _Samples, wait_fraction

_LOOK_TIMEOUT_S = 10.0  # seconds a measurement waits for each role's answer
#: half-life, in seconds, of the running sums that give a raw text source's tokenizing
#: CPU per delivered token (tokenizing comes in batches ahead of the reads)
_TOKENIZE_HALFLIFE_S = 10.0
#: seconds of looks over which the trainers' compute step time is measured
_STEP_WINDOW_S = 10.0

class Autoscaler:
    """The deployment's scaling role (actor ``NAME.autoscaler``): owns the routing table
    after launch, applies :class:`ScalePolicy` every ``interval_s`` (when enabled) and
    manual :meth:`scale` calls, and keeps every decision with its reason.  An async
    actor; one change is applied at a time."""

    def __init__(self, payload, cwd: str, name: str, namespace: str, table: RoutingTable,
                 num_documents: Sequence[int], options: Dict[str, Any],
                 loader_options: Dict[str, Any], shadows: int, detached: bool,
                 constructors: Sequence[str]) -> None:
        self._payload, self._cwd = payload, cwd
        self._name, self._namespace = name, namespace
        self._table = table
        self._ndocs = [int(n) for n in num_documents]
        self._opts = options
        self._loader_opts = dict(loader_options)
        # whether new loaders need FAILURE_DETECTION_ENV through a runtime_env
        self._failure_env = bool(self._loader_opts.pop("_failure_env", True))
        self._shadows = int(shadows if options.get("shadows") is None else options["shadows"])
        self._placement = LoaderPlacement(options.get("placement"), self._loader_opts,
                                          options["loader_cpus"])
        self._detached = bool(detached)
        # per DP group: its constructor, then its standbys
        self._ctor_groups = [[c] if isinstance(c, str) else list(c) for c in constructors]
        self._lock = asyncio.Lock()
        self.decisions: collections.deque = collections.deque(maxlen=1000)
        # final cost profiles of the loaders retired so far (view()["retired_loaders"])
        self.retired_loaders: collections.deque = collections.deque(maxlen=1000)
        self._pinned: Dict[int, int] = {}
        self._task: Optional[asyncio.Task] = None
        self._ready = False

    async def setup(self) -> Dict[str, Any]:
        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        names = list(self._table.sources)
        self._names = names
        tokens = cfg.get_int("global_batch_size") * cfg.get_int("seq_length")
        self._policy = ScalePolicy(names, lambda s, t: cfg.source_weight(s, max(0, t)),
                                   float(tokens), self._opts)
        self._planner = ray.get_actor(_registry.planner(self._name), namespace=self._namespace)
        saved = await self._planner.routing.remote()
        restarted = False
        if saved is not None and saved.version >= self._table.version:
            self._table = saved  # restarted: the table last published
            self._pinned = {int(k): int(v) for k, v in (saved.pinned or {}).items()}
            restarted = saved.version > 0
        self._handles: Dict[str, Any] = {}
        self._ctors = [ray.get_actor(n, namespace=self._namespace)
                       for grp in self._ctor_groups for n in grp]
        # which slots are dedicated to which source (slots never renumber)
        self._dedicated: Dict[int, List[int]] = {}
        gone = set(int(j) for j in self._table.retired)
        for j, d in enumerate(self._table.dedicated):
            if d is not None and j not in gone:
                self._dedicated.setdefault(int(d), []).append(j)
        self._last: Dict[str, Any] = {}
        self._samples = _Samples(len(names), int(self._opts["samples"]),
                                 int(self._opts["min_samples"]))
        self._changed = [time.monotonic()] * len(names)
        self._step_time: Optional[float] = None
        self._step_since = time.monotonic()  # when the trainers' step last moved
        self._step_win: collections.deque = collections.deque()  # (dt, steps, wait)
        # per source, decaying sums of tokenizing CPU-seconds and of delivered tokens
        self._tkz_ew = np.zeros((len(names), 2), dtype=np.float64)
        self._calibrated: set = set()
        self._free_cpus = float(ray.available_resources().get("CPU", 1.0))
        self._calib: Dict[int, float] = {}  # cost by calibration (until traffic)
        self._view: Dict[str, Any] = {}
        self._cpu_used = 0.0  # CPU-seconds reserved by dedicated loaders
        self._t_prev = time.monotonic()
        self._ready = True
        # measured always (polyload top, Deployment.scaling); decided only when enabled
        self._task = asyncio.ensure_future(self._loop(restarted))
        return {"pid": os.getpid()}

    # ----------------------------------------------------------- helpers

    def _handle(self, name: str):
        h = self._handles.get(name)
        if h is None:
            h = self._handles[name] = ray.get_actor(name, namespace=self._namespace)
        return h

    def _dedicated_count(self, s: int) -> int:
        return len(self._dedicated.get(s, []))

    def _loaders_of(self, s: int, table: Optional[RoutingTable] = None) -> List[int]:
        """The slots holding a partition of source ``s`` in ``table`` (default: the
        table in use)."""
        return (table or self._table).slots_of(s)

    async def _start_loader(self, slot: int, shards) -> List[str]:
        """A new slot's actor and standbys, sources open; their names."""
        from ._source_loader import SourceLoader  # noqa: PLC0415

        actor_cls = ray.remote(SourceLoader)
        names = _registry.source_loader_slot(self._name, slot, self._shadows)
        # a name left by an interrupted change (killed, not yet released): wait for it
        for n in names:
            for _ in range(100):
                try:
                    h = ray.get_actor(n, namespace=self._namespace)
                except ValueError:
                    break
                ray.kill(h, no_restart=True)
                await asyncio.sleep(0.1)
        made = []
        primary_node = None
        for k, n in enumerate(names):
            # detached: an actor's actors die with it, and these must outlive a restart
            # of the autoscaler; each leaves once the deployment's planner is gone
            o = {"name": n, "namespace": self._namespace, "max_concurrency": 2,
                 "max_restarts": -1, "lifetime": "detached"}
            # standbys read only when their primary is gone: no CPU, another node
            p = self._placement.pick(0.0 if k else None, avoid=primary_node if k else None)
            node_id = p.pop("node_id", None)
            if k == 0:
                primary_node = node_id
            o.update(p)
            o.setdefault("num_cpus", float(self._opts["loader_cpus"]))
            if k > 0:
                o["num_cpus"] = 0
            if node_id is not None:
                o["scheduling_strategy"] = node_affinity(node_id, soft=k > 0)
            a = actor_cls.options(**with_failure_detection(o, self._failure_env)).remote(
                self._payload, self._cwd, shards, _registry.planner(self._name))
            self._handles[n] = a
            made.append(a)
        # the standbys hold no tokenizer nor index pages until they take over
        await asyncio.gather(*[a.setup.remote(True, standby=k > 0)
                               for k, a in enumerate(made)])
        return names

    async def _publish_planner(self, table: RoutingTable) -> None:
        """The planner routes by ``table`` (with the manual pins, kept for a restarted
        autoscaler) and keeps it in its checkpoint."""
        table.check(self._ndocs)
        await self._planner.set_routing.remote(
            dataclasses.replace(table, pinned=dict(self._pinned)))

    async def _publish_constructors(self, table) -> None:
        """Every constructor routes by ``table`` and no read of an older one is in
        flight; the planner's lengths calls of older tables are done.  A constructor
        that died meanwhile reads the table at its restart (from the planner)."""
        deadline = time.monotonic() + float(self._opts["start_timeout_s"])
        res = await asyncio.gather(*[asyncio.wait_for(c.set_routing.remote(table),
                                                      self._opts["start_timeout_s"])
                                     for c in self._ctors], return_exceptions=True)
        for r in res:
            if isinstance(r, asyncio.TimeoutError):
                raise RuntimeError(
                    f"autoscaler: a constructor still had reads of a table older than "
                    f"v{table.version} in flight after start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s; kept loaders keep both tables' "
                    f"partitions, and retired loaders stay up, unused")
            if isinstance(r, BaseException):
                if not actor_lost(unwrap(r)):
                    raise unwrap(r)  # kept loaders keep both tables' partitions
                self._error(f"publishing routing v{table.version} to a constructor "
                            f"that is restarting (it reads the table then): "
                            f"{type(r).__name__}")
        while not await self._planner.drained.remote(table.version):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"autoscaler: the planner still had lengths calls of a table older "
                    f"than v{table.version} after start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s; kept loaders keep both tables' "
                    f"partitions, and retired loaders stay up, unused")
            await asyncio.sleep(0.05)

    def _error(self, msg: str) -> None:
        self.decisions.append({"time": time.time(), "step": self._view.get("step"),
                               "source": None, "from": None, "to": None,
                               "reason": f"error: {msg}"})

    # ----------------------------------------------------------- changes

    def _names_of(self, j: int) -> List[str]:
        return _registry.source_loader_slot(self._name, j, self._shadows)

    async def _keep_final_profiles(self, names: Sequence[str]) -> None:
        """Before retiring loaders: keep what each one used (its last cost profile,
        asked of all at once with a 2 s limit; a loader that does not answer is
        recorded with ``"error"`` and no ``cpu_s``), so the CPU a pool used still
        counts its retired loaders (``view()["retired_loaders"]``: the last 1,000
        retired since this autoscaler started)."""
        async def one(n):
            rec: Dict[str, Any] = {"actor": n, "time": time.time(),
                                   "step": self._view.get("step")}
            try:
                p = await asyncio.wait_for(self._handle(n).profile.remote(), timeout=2.0)
                rec.update({k: p.get(k) for k in ("cpu_s", "read_cpu_s", "wall_s", "busy_s")})
                rec["sources"] = {self._names[int(s)]: v
                                  for s, v in (p.get("sources") or {}).items()}
            except Exception as e:  # noqa: BLE001 - lost or busy: recorded as unknown
                rec["error"] = f"{type(e).__name__}: {e}"[:200]
            return rec

        self.retired_loaders.extend(await asyncio.gather(*[one(n) for n in names]))

    async def _kill(self, names: Sequence[str], forget: bool = True) -> None:
        """Kill these loaders for good (and drop their partitions from Ray's KV)."""
        for n in names:
            h = self._handles.pop(n, None)
            if h is None:
                try:
                    h = ray.get_actor(n, namespace=self._namespace)
                except ValueError:
                    h = None
            if h is not None:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            if forget:
                _registry.kv_del(_registry.shards_key(self._namespace, n))

    async def _set_shards(self, names: Sequence[str], shards) -> None:
        """``set_shards`` on each actor, asked again after a restart of the actor
        (idempotent); an actor gone for good is skipped (its slot's standby serves)."""
        async def one(n):
            for attempt in range(20):
                try:
                    return await self._handle(n).set_shards.remote(shards)
                except Exception as e:  # noqa: BLE001
                    if not actor_lost(unwrap(e)) or attempt == 19:
                        raise
                    await asyncio.sleep(0.5)
        await asyncio.gather(*[one(n) for n in names])

    async def _resize(self, counts: Mapping[int, int]) -> None:
        """Give each source in ``counts`` that many dedicated loaders (0: back on the
        shared actors), in the order of the module's docstring.  Until the planner
        holds the new table nothing has changed (new actors are killed on a failure);
        after that the new table is the deployment's, and what is left (constructors
        that died meanwhile read it at their restart, shrinking kept loaders, retiring
        the others) is finished here or by a restarted autoscaler (:meth:`_reconcile`)."""
        old = self._table
        slots = [list(x) for x in old.slots]
        dedicated = list(old.dedicated)
        was_retired = set(int(j) for j in old.retired)
        parts = [list(p) for p in old.partitions]
        old_shards = old.slot_shards()
        new_slots: Dict[int, List[Tuple[int, int, int]]] = {}
        retired: List[int] = []
        dedicated_of = {k: list(v) for k, v in self._dedicated.items()}  # committed last
        for s, n in counts.items():
            name = self._names[s]
            mine = list(dedicated_of.get(s, []))
            keep = mine[:n]
            retired += mine[n:]
            parts = [p for p in parts if p[0] != name]
            if n == 0:  # back to the shared actors: the one with the fewest partitions
                shared = [j for j in range(len(slots)) if dedicated[j] is None
                          and j not in retired and j not in was_retired]
                load = {j: sum(1 for p in parts if p[3] == j) for j in shared}
                j = min(shared, key=lambda j: (load[j], j))
                parts.append([name, 0, self._ndocs[s], j])
                dedicated_of.pop(s, None)
                continue
            ranges = split_ranges(self._ndocs[s], n)
            owners = list(keep)
            while len(owners) < len(ranges):
                j = len(slots)  # slot indices only grow: never reused
                slots.append(self._names_of(j))
                dedicated.append(s)
                new_slots[j] = []
                owners.append(j)
            for (lo, hi), j in zip(ranges, owners):
                parts.append([name, lo, hi, j])
                if j in new_slots:
                    new_slots[j].append((s, lo, hi))
            dedicated_of[s] = owners[:len(ranges)]
        for j in retired:
            dedicated[j] = None
        table = RoutingTable(sources=list(old.sources), partitions=parts, slots=slots,
                             namespace=self._namespace, version=int(old.version) + 1,
                             dedicated=dedicated, retired=sorted(was_retired | set(retired)))
        table.check(self._ndocs)
        new_shards = table.slot_shards()
        created = [n for j in new_slots for n in slots[j]]
        try:
            # 1. new actors, their partitions open
            try:
                started = await asyncio.wait_for(
                    asyncio.gather(*[self._start_loader(j, sh) for j, sh in new_slots.items()]),
                    float(self._opts["start_timeout_s"]))
            except asyncio.TimeoutError:
                raise RuntimeError(
                    f"autoscaler: new source loaders for {sorted(self._names[s] for s in counts)} "
                    f"were not running within start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s (no node with the CPUs and resources "
                    f"of placement {self._opts.get('placement') or self._loader_opts}?); "
                    f"the pools stay as they were") from None
            finally:
                self._placement.reset()  # Ray's accounting has them now
            for (j, _), names in zip(new_slots.items(), started):
                slots[j] = names
            # 2. kept actors hold old and new partitions while both tables are in use
            both = []
            for j in range(len(old_shards)):
                if j in retired or j in was_retired:
                    continue
                union = sorted(set(old_shards[j]) | set(new_shards[j]))
                if union != sorted(old_shards[j]):
                    both.append(self._set_shards(slots[j], union))
            await asyncio.gather(*both)
            # 3. the planner first: from here on the new table is the deployment's
            await self._publish_planner(table)
        except BaseException:
            await self._kill(created)
            raise
        self._table = table
        self._dedicated = dedicated_of
        now = time.monotonic()
        for s in counts:
            self._changed[s] = now
            self._samples.clear(s)
        await self._publish_constructors(table)
        # 4. shrink and retire
        await self._finish(old_shards, new_shards, retired, slots)

    async def _finish(self, old_shards, new_shards, retired, slots) -> None:
        shrink = []
        for j in range(len(old_shards)):
            if j in retired or j >= len(new_shards) or \
                    sorted(new_shards[j]) == sorted(old_shards[j]) or j in set(
                        self._table.retired):
                continue
            shrink.append(self._set_shards(slots[j], new_shards[j]))
        results = await asyncio.gather(*shrink, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self._error(f"shrinking a kept loader's partitions: {type(r).__name__}: {r}")
        await self._keep_final_profiles([n for j in retired for n in slots[j]])
        for j in retired:
            await self._kill(slots[j])

    async def _reconcile(self) -> None:
        """After a restart of the autoscaler: finish what a change it was making left
        (actors of retired slots or of slots the table never got are killed, live
        loaders hold exactly their partitions of the table)."""
        from ray.util import list_named_actors  # noqa: PLC0415

        table = self._table
        gone = set(int(j) for j in table.retired)
        stray = []
        for a in list_named_actors(all_namespaces=True):
            n = a.get("name", "")
            if a.get("namespace") != self._namespace:
                continue
            j = _registry.slot_of(self._name, n)
            if j is None:
                continue
            if j >= len(table.slots) or j in gone:
                stray.append(n)
        await self._kill(stray)
        await self._publish_constructors(table)
        shards = table.slot_shards()
        await asyncio.gather(*[self._set_shards(table.slots[j], shards[j])
                               for j in range(len(table.slots)) if j not in gone],
                             return_exceptions=True)

    async def scale(self, source: str, n: Optional[int]) -> Dict[str, Any]:
        """Give ``source`` ``n`` dedicated loaders (0: back on the shared actors) and
        hold it there (the policy leaves it alone) until ``scale(source, None)``."""
        await self._ensure()
        if source not in self._names:
            raise ValueError(f"scale: unknown source {source!r} (sources: {self._names})")
        s = self._names.index(source)
        if n is None:
            self._pinned.pop(s, None)
            self._log(s, self._dedicated_count(s), self._dedicated_count(s),
                      "manual: released to the policy")
            return self.view_now()
        n = int(n)
        if n < 0:
            raise ValueError(f"scale: n must be >= 0, got {n}")
        async with self._lock:
            before = self._dedicated_count(s)
            old_pin = self._pinned.get(s)
            self._pinned[s] = n  # published with the table
            try:
                if n != before:
                    await self._resize({s: n})
            except BaseException:
                if old_pin is None:
                    self._pinned.pop(s, None)
                else:
                    self._pinned[s] = old_pin
                raise
            self._log(s, before, n, "manual: Deployment.scale")
        return self.view_now()

    def _log(self, s: int, a: int, b: int, reason: str, step: Optional[int] = None,
             ahead: int = 0) -> None:
        rec = {"time": time.time(), "step": step if step is not None else self._view.get("step"),
               "ahead": ahead, "source": self._names[s], "from": a, "to": b, "reason": reason,
               "version": self._table.version}
        self.decisions.append(rec)

    async def _ensure(self) -> None:
        if not self._ready:
            await self.setup()

    # ----------------------------------------------------------- the loop

    async def _measure(self) -> Dict[str, Any]:
        """One look at the loaders, constructors and planner: costs, utilization, wait."""
        slots = self._table.slots
        live = sorted({int(p[3]) for p in self._table.partitions})
        look = _LOOK_TIMEOUT_S  # a role that does not answer is left out of this look
        profs = await asyncio.gather(*[asyncio.wait_for(
            self._handle(slots[j][0]).profile.remote(), look) for j in live],
            return_exceptions=True)
        flat = await asyncio.gather(*[asyncio.wait_for(c.load.remote(), look)
                                      for c in self._ctors], return_exceptions=True)
        loads: List[Any] = []  # per group: the constructor serving it (most fetches)
        for grp in self._ctor_groups:
            xs, flat = flat[:len(grp)], flat[len(grp):]
            ok = [x for x in xs if not isinstance(x, BaseException) and x.get("serving", True)]
            loads.append(max(ok, key=lambda x: x["fetches"]) if ok else
                         RuntimeError("no constructor of the group answered"))
        prog = await asyncio.wait_for(self._planner.progress.remote(), look)
        now = time.monotonic()
        last = self._last
        dt = max(1e-6, now - last.get("time", now - 1e-6))
        n = len(self._names)
        per_src_busy = [0.0] * n
        read_cpu, read_tok = [0.0] * n, [0.0] * n
        tok_cpu = [0.0] * n
        slot_util: Dict[int, float] = {}
        slot_cpu: Dict[int, float] = {}
        prev_profs = last.get("profs", {})
        for j, p in zip(live, profs):
            if isinstance(p, BaseException):
                continue
            q = prev_profs.get(j)
            # kept until the next look, compact: the sources' counters as one array
            # (busy_s, tokens, read_cpu_s, tokenize_cpu_s) by source index
            served = sorted(int(s) for s in p["sources"])
            src = np.array([[p["sources"][s][k] for k in (
                "busy_s", "tokens", "read_cpu_s", "tokenize_cpu_s")]
                for s in served], dtype=np.float64).reshape(-1, 4)
            p = {k: p[k] for k in ("pid", "busy_s", "wall_s", "cpu_s", "read_cpu_s",
                                   "read_split") if k in p}
            p["index"], p["sources"] = np.asarray(served, dtype=np.int64), src
            prev_profs[j] = p
            if q is None or q.get("pid") != p.get("pid"):  # new or restarted: no delta
                continue
            # busy fraction (two calls may overlap: capped at 1), CPU it got per second
            slot_util[j] = min(1.0, (p["busy_s"] - q["busy_s"]) /
                               max(1e-6, p["wall_s"] - q["wall_s"]))
            slot_cpu[j] = (p["cpu_s"] - q["cpu_s"]) / max(1e-6, p["wall_s"] - q["wall_s"])
            # A loader's reads and its tokenizing serve all its sources at once.  Reads:
            # the actor splits each call's CPU by the time C measured per source
            # ("read_split": "time"), taken as it is; a profile without it is split
            # here by tokens x each source's calibrated cost (measured alone), so an
            # image source packed with a token source is not charged to the tokens.
            # Tokenizing CPU is measured per source in C (profile "tokenize_cpu_s").
            timed = p.get("read_split") == "time"
            d_read, d_rcpu = {}, 0.0
            qi = q["index"]  # the previous look's counters of the same sources (0: none)
            before = np.zeros((len(served), 4), dtype=np.float64)
            if len(qi) and len(served):
                at = np.minimum(np.searchsorted(qi, p["index"]), len(qi) - 1)
                was = qi[at] == p["index"]
                before[was] = q["sources"][at[was]]
            for k, s in enumerate(served):
                v, u = p["sources"][k], before[k]
                per_src_busy[s] += float(v[0] - u[0])
                d_read[s] = int(v[1] - u[1])
                d_rcpu += float(v[2] - u[2])
                tok_cpu[s] += max(0.0, float(v[3] - u[3]))
                read_tok[s] += d_read[s]
                if timed:
                    read_cpu[s] += float(v[2] - u[2])
            w_read = {s: d_read[s] * self._prior(s) for s in d_read}
            sr = sum(w_read.values())
            if sr > 0 and not timed:
                for s in d_read:
                    read_cpu[s] += d_rcpu * w_read[s] / sr
        # Tokenizing per delivered token: a document is tokenized whole (ahead, for its
        # length) though long_documents: truncate delivers only its first seq_length
        # tokens, so the CPU per tokenized token would understate the cost of a token
        # delivered (by 1.7x on the bench's docs).  Tokenizing comes in batches ahead of
        # the reads: both sides are summed with a decay (half-life _TOKENIZE_HALFLIFE_S)
        # and their ratio is the source's tokenizing cost per delivered token.
        decay = 0.5 ** (dt / _TOKENIZE_HALFLIFE_S)
        self._tkz_ew *= decay
        self._tkz_ew[:, 0] += tok_cpu
        self._tkz_ew[:, 1] += read_tok
        for s in range(n):
            if read_tok[s] > 0 and now - self._changed[s] >= self._opts["steady_s"]:
                # CPU-seconds per delivered token: reading it, plus tokenizing it (0 for
                # a pre-tokenized source)
                c = read_cpu[s] / read_tok[s] + self._tkz_ew[s, 0] / self._tkz_ew[s, 1]
                self._samples.append(s, c)
        # the constructors' fetch waits, as differences per constructor process (a
        # restarted constructor starts its counter again)
        prev_waits = last.get("waits", {})
        waits: Dict[int, Tuple[int, float]] = {}
        d_wait = 0.0
        for g, x in enumerate(loads):
            if isinstance(x, BaseException):
                continue
            # the trainers' own wait when they report it (Client.data_wait_s), else the
            # fetches' wait at the constructor (an upper bound)
            w = x["trainer_wait_s"] if x.get("trainer_ranks") else x["wait_s"]
            waits[g] = (x.get("pid"), w, bool(x.get("trainer_ranks")))
            q = prev_waits.get(g)
            if q is not None and q[0] == x.get("pid") and q[2] == waits[g][2]:
                d_wait += max(0.0, w - q[1])
        wait = last.get("wait", 0.0) + d_wait  # cumulative over processes
        fetches = sum(x["fetches"] for x in loads if not isinstance(x, BaseException))
        queue = min([x["queue_steps"] for x in loads if not isinstance(x, BaseException)],
                    default=0)
        # the trainers' step: the least one their fetches reported (finer than the
        # planner's, which hears of it once per plan request)
        lows = [x["consumed"] for x in loads if not isinstance(x, BaseException)
                and x.get("consumed", -1) >= 0]
        step = min(lows) if len(lows) == len(self._ctor_groups) and lows else \
            (prog["low"] if prog["low"] >= 0 else prog["start_step"])
        wait_frac = 0.0
        if "step" in last:
            steps = max(0, step - last["step"])
            # ranks wait concurrently: the mean rank's wait
            n_ranks = max(1, len(self._cfg_ranks()))
            wait_frac = wait_fraction(dt, steps, (wait - last["wait"]) / n_ranks,
                                      now - self._step_since, self._step_time)
            # compute step time: the looks of the last _STEP_WINDOW_S seconds, their
            # time less the mean rank's wait, over the steps finished (a look sees 0, 1
            # or 2 steps of the trainers' reports: one look's figure was off by up to 2x)
            win = self._step_win
            win.append((dt, steps, max(0.0, (wait - last["wait"]) / n_ranks)))
            while len(win) > 1 and sum(x[0] for x in win) - win[0][0] >= _STEP_WINDOW_S:
                win.popleft()
            n_steps = sum(x[1] for x in win)
            if n_steps > 0:
                self._step_time = max(1e-6, (sum(x[0] for x in win) -
                                             sum(x[2] for x in win)) / n_steps)
        if "step" not in last or step != last["step"]:
            self._step_since = now
        # Sources with no traffic yet (weight 0 now): calibrate once on their owner
        # (a first estimate, replaced by the samples of traffic once there are any).
        # Only with the policy enabled: without it nothing decides from the estimate,
        # and each calibration costs an actor call, a read of 32 documents and a result
        # kept, per source (memory that grew with the sources; the view's cost of a
        # source stays None until traffic).
        todo = [s for s in range(n) if not self._samples.has(s) and s not in self._calibrated
                and self._loaders_of(s)] if self._opts.get("enabled", True) else []
        for k in range(0, len(todo), 16):
            batch = todo[k:k + 16]
            self._calibrated.update(batch)
            res = await asyncio.gather(*[asyncio.wait_for(
                self._handle(slots[self._loaders_of(s)[0]][0]).calibrate.remote(s, 32), 60.0)
                for s in batch], return_exceptions=True)
            for s, c in zip(batch, res):
                if not isinstance(c, BaseException) and c["tokens"] > 0:
                    self._calib[s] = c["cpu_s"] / c["tokens"]
        self._last = {"time": now, "step": step, "wait": wait, "profs": prev_profs,
                      "waits": waits}
        util = []
        for s in range(len(self._names)):
            mine = self._loaders_of(s)
            us = [slot_util[j] for j in mine if j in slot_util]
            if self._dedicated_count(s) == 0 and us:
                # packed: its share of the shared actors' busy time
                util.append(min(1.0, per_src_busy[s] / dt / max(1, len(mine))))
            else:
                util.append(float(np.mean(us)) if us else 0.0)
        cpu_rate: List[Optional[float]] = []
        for s in range(len(self._names)):
            cs = [slot_cpu[j] for j in self._loaders_of(s) if j in slot_cpu]
            cpu_rate.append(float(np.mean(cs)) if cs else None)
        return {"step": step, "wait_frac": wait_frac, "queue_steps": queue, "util": util,
                "cpu_rate": cpu_rate,
                "fetches": fetches, "dt": dt, "next_step": prog["next_step"],
                "ahead": max(0, int(prog["next_step"]) - int(step))}

    def _cfg_ranks(self) -> List[int]:
        return list(range(self._cfg.world_size()))

    def _prior(self, s: int) -> float:
        """A source's cost measured alone (calibration), to split a shared loader's CPU;
        the median of the others' when it has none."""
        c = self._calib.get(s)
        if c is not None and c > 0:
            return c
        known = [v for v in self._calib.values() if v > 0]
        return float(np.median(known)) if known else 1.0

    def _cost(self, s: int) -> Optional[float]:
        c = self._samples.median(s)
        return c if c is not None else self._calib.get(s)

    def _budget(self) -> float:
        """``cpu_budget``, default the CPUs free in the cluster when the deployment
        started (what its other roles and other jobs left)."""
        b = self._opts.get("cpu_budget")
        return float(b) if b is not None else self._free_cpus

    def _cpus_per_loader(self) -> float:
        """CPUs a dedicated loader reserves: its placement's ``num_cpus``, else
        ``loader_cpus``."""
        return self._placement.cpus_per_loader()

    async def _tick(self) -> None:
        async with self._lock:  # a manual scale() never interleaves with a decision
            await self._tick_locked()

    async def _tick_locked(self) -> None:
        m = await self._measure()
        now = time.monotonic()
        self._cpu_used += sum(self._dedicated_count(s) for s in range(len(self._names))) \
            * self._cpus_per_loader() * m["dt"]
        views = [SourceView(self._cost(s), m["util"][s], self._dedicated_count(s),
                            m["cpu_rate"][s]) for s in range(len(self._names))]
        if self._opts.get("enabled", True):
            target, decisions = self._policy.decide(
                now, m["step"], self._step_time, m["wait_frac"], views, self._pinned,
                self._budget(), m["queue_steps"], m["ahead"], self._cpus_per_loader())
        else:  # manual control only: measure, never change
            target, decisions = [v.loaders for v in views], []
        need = [None if v.cost_per_token is None or self._step_time is None else
                self._policy.need(s, m["step"], v.cost_per_token, self._step_time,
                                  m["ahead"])[0]
                for s, v in enumerate(views)]
        self._view = {**m, "step_time": self._step_time, "target": target, "need": need,
                      "cost": [v.cost_per_token for v in views],
                      "held_by_margin": sorted(self._policy.held_by_margin)}
        for h in self._policy.held:  # feedback the policy held back: logged with why
            self.decisions.append({**h, "time": time.time(), "ahead": m["ahead"],
                                   "from": None, "to": None,
                                   "version": self._table.version})
        self._policy.held.clear()
        changes = {self._names.index(d["source"]): d["to"] for d in decisions}
        if changes:
            await self._resize(changes)
            for d in decisions:
                s = self._names.index(d["source"])
                self._log(s, d["from"], d["to"], d["reason"], m["step"], d["ahead"])

    async def _loop(self, restarted: bool = False) -> None:
        if restarted:
            async with self._lock:
                try:
                    await self._reconcile()
                except Exception as e:  # noqa: BLE001
                    self._error(f"after a restart: {type(e).__name__}: {e}")
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep scaling; say why in the log
                self._error(f"{type(e).__name__}: {e}")
            await asyncio.sleep(float(self._opts["interval_s"]))

    # ----------------------------------------------------------- visibility

    def view_now(self) -> Dict[str, Any]:
        v = self._view
        gone = set(self._table.retired)
        ded = self._table.dedicated
        srcs = []
        for s, name in enumerate(self._names):
            mine = self._loaders_of(s)
            srcs.append({
                "source": name,
                "weight": self._cfg.source_weight(s, max(0, int(v.get("step") or 0))),
                "loaders": len(mine),
                "dedicated": self._dedicated_count(s),
                "partitions": sum(1 for p in self._table.partitions if p[0] == name),
                "util": (v.get("util") or [0.0] * len(self._names))[s],
                "cpu_rate": (v.get("cpu_rate") or [None] * len(self._names))[s],
                "cost_per_token": self._cost(s),
                "target": (v.get("target") or [None] * len(self._names))[s],
                "need": (v.get("need") or [None] * len(self._names))[s],
                # kept above the need by down_margin (one loader fewer would not hold it)
                "held_by_margin": s in (v.get("held_by_margin") or ()),
                "pinned": self._pinned.get(s),
            })
        return {"sources": srcs, "step": v.get("step"), "step_time": v.get("step_time"),
                "wait_frac": v.get("wait_frac"), "queue_steps": v.get("queue_steps"),
                "routing_version": self._table.version,
                "cpu_seconds_reserved": self._cpu_used,
                "slots": [{"slot": j, "actors": list(names),
                           "dedicated": (None if ded[j] is None else self._names[ded[j]]),
                           "shards": [p[:3] for p in self._table.partitions
                                      if int(p[3]) == j]}
                          for j, names in enumerate(self._table.slots) if j not in gone],
                "decisions": list(self.decisions),
                "retired_loaders": list(self.retired_loaders)}

    async def view(self) -> Dict[str, Any]:
        """Per source: its weight now, loaders (actors holding a partition of it),
        dedicated loaders, partitions, utilization, measured cost (CPU-seconds per
        token), the feed-forward need (loaders, over the horizon), the policy's target
        and a manual pin; the trainers' step time, data
        wait fraction, queue depth, the routing version, CPU-seconds reserved by
        dedicated loaders, the live slots, every decision with its reason and the
        final cost profiles of the loaders retired (``retired_loaders``)."""
        await self._ensure()
        return self.view_now()

    async def table(self) -> RoutingTable:
        """The routing table in use."""
        await self._ensure()
        return self._table

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
