"""The data constructor actor (``NAME.constructor.G``, standbys ``.shadow.K``): the
fan-out layer for a group of DP ranks and all their TP, PP and CP peers.

It hosts a ``pl_pipeline`` (``polyload._core.Pipeline``): the C object that also drives
the embedded loader decides which step to plan and which unit to build, holds
back-pressure and the lag policy.  A unit is one DP rank's step; it is built as a
*package* (``pl_package_encode``: the rank's plan and its tokens at stored width) and
returned to each trainer rank of that DP rank as the result of its ``fetch`` call, which
the trainer expands into micro-batches in C (``pl_loader_push_package``).  An async
actor: its waits are awaits, never polls.  Its jobs are split among helpers: the reads
(:class:`~polyload.ray._reads.ReadRouter`), what each served rank has received and
reported (:class:`RankLedger`), which constructor of the group serves
(:class:`Succession`) and the figures the autoscaler reads (:class:`LoadMeter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from ._calls import error_parts, node_id
from ._config import enter_cwd, make_config
from ._protocol import StoodDown, pack_fetch
from ._reads import ReadRouter
from ._routing import RoutingTable

#: Bytes per token of each stored dtype (``polyload._core.DTYPE_*``).
_WIDTH = {_core.DTYPE_UINT8: 1, _core.DTYPE_INT8: 1, _core.DTYPE_INT16: 2,
          _core.DTYPE_UINT16: 2, _core.DTYPE_INT32: 4, _core.DTYPE_UINT32: 4,
          _core.DTYPE_INT64: 8, _core.DTYPE_FLOAT32: 4, _core.DTYPE_FLOAT64: 8}

#: The most plans a constructor asks the planner for in one call: a plan covers the
#: whole global batch, so calls of ``prefetch_steps`` (up to 512) could be tens of MB and
#: hold the planner (one call at a time) from ``state`` calls.
PLANS_PER_CALL = 64


class RankLedger:
    """Per served rank: the next step to serve it (``cursor``), what its trainer reported
    (``consumed``: the step it stands at; ``have``: the first step it has not received;
    ``at``: it finished every step before this one, where a client started again for
    the rank continues; ``trainer_wait``: its data wait so far, seconds), the packages
    served but maybe not received (``recent``: step -> package, asked again after a
    call lost in a restart) and its last call (``last_call``, for error messages)."""

    def __init__(self) -> None:
        self.trainer_wait: Dict[int, float] = {}
        self.cursor: Dict[int, int] = {}
        self.consumed: Dict[int, int] = {}
        self.have: Dict[int, int] = {}
        self.at: Dict[int, int] = {}
        self.recent: Dict[int, Dict[int, Any]] = {}
        self.last_call: Dict[int, Tuple[int, int, int, int]] = {}

    def reset(self, ranks: Sequence[int], step: int) -> None:
        """Every rank stands at ``step`` (a new generation, or a take-over)."""
        self.cursor = {r: step for r in ranks}
        # the step each rank's trainer stands at, and the first it has not received
        # (reported by its fetches)
        self.consumed = dict(self.cursor)
        self.have = dict(self.cursor)
        # the step each rank's trainer reached a step boundary at (``at``): where a
        # client started again for the rank continues (``rejoin``)
        self.at = dict(self.cursor)
        self.recent = {}
        self.last_call = {}

    def report(self, rank: int, step: int, count: int, consumed: int, have: int, at: int,
               waited: float, max_lag: int) -> None:
        """What a fetch of ``rank`` reports (see ``DataConstructor.fetch``); drops the
        kept packages the trainer no longer needs."""
        if consumed > self.consumed[rank]:
            self.consumed[rank] = int(consumed)
        if have > self.have[rank]:
            self.have[rank] = int(have)
        if at > self.at.get(rank, at):
            self.at[rank] = int(at)
        if waited >= 0:  # the trainer's own data wait so far (Client.data_wait_s)
            self.trainer_wait[rank] = float(waited)
        self.last_call[rank] = (int(step), int(count), int(consumed), int(have))
        recent = self.recent.get(rank)
        if recent and have >= 0:
            # kept: what the trainer has not received, and what it received but has not
            # finished (a client started again for the rank continues there), within
            # the lag limit
            lo = max(min(int(have), self.at[rank]), int(have) - max_lag)
            for s in [s for s in recent if s < lo]:
                del recent[s]

    def served(self, rank: int, step: int, pkg: Any) -> None:
        """``rank`` got the package of ``step``."""
        self.cursor[rank] = step + 1
        # Until the client says it has them (fetch's `have`), served packages stay: a
        # call lost on the way (Ray: "may or may not have been executed") is asked again.
        self.recent.setdefault(rank, {})[step] = pkg

    def keep_from(self) -> int:
        """The least step a rank stands at or may be started again at (``at``: one
        step before its consumed position when it stands at a step boundary, and
        reported late): the planner keeps states from there."""
        return min(min(self.consumed.values()), min(self.at.values()))

    def need(self) -> int:
        """The least step a rank has not received (where a standby that takes over may
        start)."""
        return min(self.have.values())


class Succession:
    """Which constructor of a DP group serves it, as this one sees it.

    A constructor serves from launch (a primary) or from its first fetch (a standby, or
    an actor Ray restarted): :meth:`take_over`.  When another one of the group takes
    over, this one stands down (:meth:`stand_down`).  Each change starts a new
    ``term``: a fetch begun in an earlier term raises StoodDown rather than answer from
    a pipeline this one no longer owns.  ``epoch`` ``(time, actor name)`` of the last
    take-over orders two that take over at once (the later stays, so they never stand
    each other down).  Per rank, ``seen_switches`` is the most moves its Client had
    made at a call here, and ``stood_switches`` that figure when this one last stood
    down: a call not from a later move than that is one the client abandoned.
    """

    def __init__(self, standby: bool, group: Sequence[str]) -> None:
        self.standby = bool(standby)
        self.serving = False
        self.term = 0
        self.seen_switches: Dict[int, int] = {}
        self.stood_switches: Dict[int, int] = {}
        self.epoch: Tuple[float, str] = (0.0, "")
        #: the actor name of the one serving since this one stood down
        self.peer: Optional[str] = None
        #: this group's constructors: primary, standbys
        self.group = list(group)
        #: rebuilt from the group's position (a standby or restarted actor that serves)
        self.recovered = False
        #: when a standby or restarted constructor started serving, and from which step
        self.activated: Optional[Dict[str, Any]] = None
        self._t0 = 0.0

    def abandoned(self, rank: int, switches: int) -> bool:
        """Whether a call of ``rank``'s client (after ``switches`` moves) is one it
        abandoned: this one stood down, and the call is not from a later move."""
        return not self.serving and 0 <= int(switches) <= self.stood_switches.get(int(rank), -1)

    def saw(self, rank: int, switches: int) -> None:
        """A call of ``rank``'s client after ``switches`` moves."""
        if switches > self.seen_switches.get(int(rank), -1):
            self.seen_switches[int(rank)] = int(switches)

    def take_over(self, me: str, step: int, t0: float) -> None:
        """This one (actor ``me``) serves from ``step``, after a set-up begun at
        monotonic time ``t0``."""
        self.serving = True
        self.term += 1
        self.epoch = (time.time(), me)
        self.peer = None
        self.activated = {"step": step, "time": time.time(), "standby": self.standby,
                          "took_s": time.monotonic() - t0, "first_package_s": None}
        self._t0 = t0

    def stand_down(self, epoch: Optional[Tuple[float, str]]) -> bool:
        """Another one took over at ``epoch``: stop serving unless this one took over
        later.  Whether it stood down."""
        if self.serving and (epoch is None or epoch > self.epoch):
            self.serving = False
            self.peer = epoch[1] if epoch is not None else None
            self.term += 1
            self.stood_switches = dict(self.seen_switches)
            return True
        return False

    def current(self, term: int) -> bool:
        """Whether this one still serves in ``term``."""
        return term == self.term and self.serving

    def first_package(self) -> None:
        """A package was served: the first since the take-over is timed."""
        if self.activated is not None and self.activated["first_package_s"] is None:
            self.activated["first_package_s"] = time.monotonic() - self._t0


class LoadMeter:
    """What a constructor counts for the autoscaler and for ``memory()``: seconds
    fetches waited for a package not built yet (``wait_s``; the waits going on are in
    ``waits_now``), fetches served, ``at`` calls received, build batches and units
    built, the newest step built, and the fetches waiting now (``waiting``)."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.waits_now: Dict[object, float] = {}  # waits going on: their start
        self.waiting = 0  # fetches blocked on a unit not built yet
        self.fetches = 0
        self.at_calls = 0  # DataConstructor.at calls received
        self.build_batches = 0
        self.units_built = 0
        self.built_step = -1

    @contextlib.contextmanager
    def waiting_for_package(self) -> Iterator[None]:
        """Count the time in the block as a fetch's wait for a package."""
        self.waiting += 1
        t0 = time.monotonic()
        key = object()
        self.waits_now[key] = t0
        try:
            yield
        finally:
            self.waiting -= 1
            del self.waits_now[key]
            self.wait_s += time.monotonic() - t0

    def waited_s(self) -> float:
        """Seconds fetches waited for packages, the waits still going on included."""
        now = time.monotonic()
        return self.wait_s + sum(now - t0 for t0 in self.waits_now.values())


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
        self._succ = Succession(standby, group)
        self._index = int(index)
        self._dp_ranks = [int(d) for d in dp_ranks]
        self._planner_name = planner
        # per source-loader slot: the primary's name, then its standbys' (shadows)
        self._reads = ReadRouter(index, namespace, read_timeout, loaders)
        self._ledger = RankLedger()
        self._meter = LoadMeter()
        self._ready = False
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
        rt = await self._planner.routing.remote()
        if rt is not None and (rt.version > 0 or self._routing is None):
            # scaled since launch, or the launch's table (set before any constructor)
            self._reads.apply(rt.version, *rt.for_constructors())
        else:
            self._reads.apply(0, self._routing, self._reads.slot_names)
        self._routing = None  # as compact arrays from here on (in self._reads)
        # Three wake-ups, so that nobody wakes for what it does not wait for:
        # units built or steps added (consumers), room or demand (drivers), a
        # rank's cursor moved (its next fetch, which serves steps in order).
        self._built = asyncio.Condition()
        self._demand = asyncio.Condition()
        self._served = asyncio.Condition()
        self._reset_lock = asyncio.Lock()
        self._gen = -1
        self._final: Optional[bytes] = None
        self._peer_warm: List[Any] = []
        if not (recovering or self._succ.standby):
            gen, z = await self._planner.current.remote(True)
            blob = _core.state_unpack(z)
            await self._reset(gen, blob)
            self._succ.serving = True
        else:  # connect to the source loaders now, not at the first read after a failure
            try:
                await asyncio.wait_for(asyncio.gather(
                    *[h.pid.remote() for h in self._reads.handles()],
                    return_exceptions=True), 10.0)
            except asyncio.TimeoutError:
                pass
        self._ready = True
        return {"pid": os.getpid(), "node_id": node_id(), "ranks": self._ranks,
                "serving": self._succ.serving}

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
        if self._succ.serving:
            return
        async with self._setup_lock:
            if self._succ.serving:
                return
            t0 = time.monotonic()
            rt, (gen, blob) = await asyncio.gather(self._planner.routing.remote(),
                                                   self._planner.resume_point.remote(self._index))
            if rt is not None:
                self._reads.apply_table(rt)
            self._succ.recovered = True
            await self._reset(gen, blob)
            me = ray.get_runtime_context().get_actor_name()
            self._succ.take_over(me, _core.state_info(blob)["step"], t0)
        for n in self._succ.group:
            if n != me:
                self._peer_warm.append(asyncio.ensure_future(self._warm_peer(n)))

    async def _warm_peer(self, name: str) -> None:
        """Make a peer of the group this one's standby: built (a restarted actor), and
        no longer serving (a peer that was stalled, not lost, still believed it served:
        clients that come back to it later must find it standing at the resume point,
        not at the step it stopped at)."""
        try:
            h = ray.get_actor(name, namespace=self._namespace)
            await asyncio.wait_for(h.stand_down.remote(self._succ.epoch), 120.0)
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
            if self._succ.stand_down(ep):
                for t in self._tasks:
                    t.cancel()
                self._tasks = []
                await self._notify()
        return os.getpid()

    async def set_routing(self, table: RoutingTable) -> int:
        """Route reads by a new table of the autoscaler; returns (the routing version in
        force) once no read routed by an older table is in flight, so the autoscaler
        may then retire the actors the new table no longer names."""
        await self._ensure_ready()
        self._reads.apply_table(table)
        await self._reads.drained()
        return self._reads.version

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
        low = min(self._ledger.cursor.values()) if self._ledger.cursor else 0
        return {"wait_s": self._meter.waited_s(), "fetches": self._meter.fetches,
                "pid": os.getpid(), "trainer_wait_s": sum(self._ledger.trainer_wait.values()),
                "consumed": min(self._ledger.consumed.values()) if self._ledger.consumed else -1,
                "trainer_ranks": len(self._ledger.trainer_wait),
                "queue_steps": max(0, self._meter.built_step + 1 - low),
                "version": self._reads.version, "time": time.monotonic(),
                "serving": self._succ.serving, "activated": self._succ.activated}

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
        self._ledger.reset(self._ranks, _core.state_info(blob)["step"])
        self._tasks = [asyncio.ensure_future(self._drive(gen)) for _ in range(self._n_drivers)]
        await self._notify()

    async def sync(self, gen: int, rank: Optional[int] = None):
        """Follow the planner to generation ``gen`` (after a restart from a state).
        With ``rank``: ``(generation, the step rank stands at here)``.  Peers that sync
        together reset the pipeline once."""
        await self._ensure_ready()
        if not self._succ.serving:  # a standby follows when it takes over
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
        return self._gen, self._ledger.cursor.get(int(rank), -1)

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
                if self._meter.waiting == 0:
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
                keep = self._ledger.keep_from()
                res = await self._planner.plans.remote(gen, w.step, self._index,
                                                       min(self._prefetch_steps,
                                                           PLANS_PER_CALL), keep,
                                                       self._ledger.need())
            except Exception as e:  # noqa: BLE001 - the ranks that reach the step get it
                if gen == self._gen:
                    self._pipe.fail_step(w.step, *error_parts(e))
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
        self._meter.build_batches += 1
        self._meter.units_built += len(units)
        try:
            per_unit = [np.asarray(u.reads()) for u in units]
            sizes = [len(r) for r in per_unit]
            reads = np.concatenate(per_unit) if per_unit else np.zeros((0, 4), np.int64)
            n = len(reads)
            outs, order, starts, ends = await self._reads.read(reads)
            self._meter.built_step = max([self._meter.built_step] + [u.step for u in units])
        except Exception as e:  # noqa: BLE001 - the ranks that reach the units get it
            if gen == self._gen:
                for u in units:
                    self._pipe.fail(u, *error_parts(e))
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
                self._pipe.fail(u, *error_parts(e))
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
                self._pipe.fail(u, *error_parts(e))
            at += k

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
        final)`` (:func:`~polyload.ray._protocol.pack_fetch`: the packages back to back
        in one uint8 array).
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
        if self._succ.abandoned(rank, switches):
            raise StoodDown(f"constructor {self._index}: a call the client abandoned",
                            self._succ.peer)
        self._succ.saw(rank, switches)
        await self._ensure_active()
        if gen > self._gen:
            await self.sync(gen)
        term = self._succ.term
        self._check_alive(term)
        if gen != self._gen:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"constructor {self._index}: the deployment was restarted from another "
                f"state (generation {self._gen}, this client has {gen}); call "
                f"load_state_dict")
        if rank not in self._ledger.cursor:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"constructor {self._index}: rank {rank} is not served here")
        self._ledger.report(rank, step, count, consumed, have, at, waited, self._max_lag)
        out: List[Any] = []
        err: Optional[Tuple[int, str]] = None
        deadline = asyncio.get_running_loop().time() + float(timeout)
        try:
            # Rebuilt from an earlier step than the trainer has: serve the rank what it
            # already has into the void (deterministic: the same packages).
            while self._succ.recovered and \
                    0 <= self._ledger.cursor[rank] < min(int(have), int(step)) \
                    and gen == self._gen:
                await self._fetch_one(gen, rank, self._ledger.cursor[rank], deadline, term)
            for s in range(int(step), int(step) + max(1, int(count))):
                again = self._ledger.recent.get(rank, {}).get(s) \
                    if s < self._ledger.cursor[rank] else None
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
        return pack_fetch(out, err)

    @ray.method(num_returns=0, enable_task_events=False)
    async def at(self, gen: int, rank: int, step: int) -> None:
        """The trainer of ``rank`` finished every step before ``step`` (from its Client,
        no answer; the latest step at most once per ``_client.AT_INTERVAL_S``)."""
        self._meter.at_calls += 1
        if self._succ.serving and gen == self._gen and step > self._ledger.at.get(rank, step):
            self._ledger.at[rank] = int(step)

    async def rejoin(self, gen: int, rank: int,
                     activate: bool = True) -> Optional[Tuple[int, int]]:
        """``(generation, step)`` a new Client of ``rank`` starts at: the first step the
        rank's trainer had not finished (``at``), whose packages are served again; the
        generation's start for a rank never served.  None from a standby that does not
        serve, unless ``activate`` (it then takes over, as at a fetch): a new client
        asks the serving one of its group, so that its start moves nobody."""
        await self._ensure_ready()
        if not (activate or self._succ.serving):
            return None
        await self._ensure_active()
        if gen > self._gen:
            await self.sync(gen)
        if rank not in self._ledger.cursor:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"constructor {self._index}: rank {rank} is not served here")
        return self._gen, self._ledger.at[rank]

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
        while self._ledger.cursor[rank] < step and gen == self._gen:  # in order per rank
            self._check_alive(term)
            await self._wait(self._served, f"turn of rank {rank} for step {step}", deadline)
        if self._ledger.cursor[rank] != step:
            raise polyload.StateError(
                _core.ESTATE, "ESTATE",
                f"constructor {self._index}: step {step} of rank {rank} was already served "
                f"(the rank stands at step {self._ledger.cursor[rank]}; kept for a retry: "
                f"{sorted(self._ledger.recent.get(rank, {}))}; last call (step, count, consumed, "
                f"have) {self._ledger.last_call.get(rank)}); "
                f"load a state to go back")
        while True:
            if gen != self._gen:
                raise polyload.StateError(_core.ESTATE, "ESTATE",
                                          "polyload.ray: the deployment was restarted meanwhile")
            self._check_alive(term)
            if self._ledger.cursor[rank] != step:
                # Another call of the rank took this step while this one waited (two
                # calls in flight, both rebuilding after a take-over): it is kept.
                kept = self._ledger.recent.get(rank, {}).get(step)
                if kept is not None:
                    return kept
                raise polyload.StateError(
                    _core.ESTATE, "ESTATE",
                    f"constructor {self._index}: step {step} of rank {rank} was served to "
                    f"another call meanwhile and is not kept (the rank stands at step "
                    f"{self._ledger.cursor[rank]})")
            try:
                res = self._pipe.next(rank, self._nmb, 0)
            except polyload.PolyloadTimeoutError:  # not built yet: woken by the drivers
                await self._wake(self._demand)  # the request may have opened the window
                with self._meter.waiting_for_package():
                    await self._wait(self._built, f"package of rank {rank}, step {step}", deadline)
                continue
            break
        if res is None:
            return self._final
        self._meter.fetches += 1
        self._succ.first_package()
        data, got_step, _mb, _count = res
        pkg = np.frombuffer(data, dtype=np.uint8)
        self._ledger.served(rank, got_step, pkg)
        return pkg

    async def failover_log(self) -> List[Dict[str, Any]]:
        """The reads this constructor moved to a standby source loader."""
        return list(self._reads.failovers)

    def _check_alive(self, term: Optional[int] = None) -> None:
        if self._closed:
            raise polyload.PolyloadError(_core.ECLOSED, "ECLOSED",
                                         f"constructor {self._index} is closed")
        if term is not None and not self._succ.current(term):
            raise StoodDown(f"constructor {self._index} "
                            f"({ray.get_runtime_context().get_actor_name()}) stood down: "
                            f"{self._succ.peer or 'another constructor of its group'} "
                            f"serves", self._succ.peer)

    async def position(self, activate: bool = False) -> Optional[Tuple[int, int, int]]:
        """``(generation, step, micro-batch)``: the position after the micro-batches
        delivered to every served rank (the deployment's view; a Client's own state
        is exact for its rank); None for a standby that does not serve, unless
        ``activate`` (it then takes over, as at a fetch)."""
        if activate:
            await self._ensure_active()
        await self._ensure_ready()
        if not self._succ.serving:
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
                "build_batches": self._meter.build_batches,
                "units_built": self._meter.units_built, "at_calls": self._meter.at_calls}

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        self._closed = True
        self._pipe.stop()
        for t in self._tasks:
            t.cancel()
        await self._notify()
