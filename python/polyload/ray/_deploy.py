"""``launch()``: start the actors of a deployment; ``attach()``: find a running one;
``Deployment``: its handle."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import ray

import polyload
from polyload import _core
from polyload.loader import _state_blob

from . import _registry
from ._autoscaler import Autoscaler
from ._calls import actor_lost, get, unwrap
from ._config import config_payload, make_config, stored_payload
from ._constructor import DataConstructor
from ._failure import set_failure_detection_env, with_failure_detection
from ._placement import (ROLES, alive_nodes, check_cpus, node_affinity, role_options,
                         standby_node)
from ._planner import Planner
from ._protocol import PROTOCOL
from ._routing import RoutingTable, launch_partitions
from ._scale_policy import ScalePolicy, autoscale_options
from ._source_loader import SourceLoader

#: Source-loader actors when ``num_source_loaders`` is not given: the partitions of all
#: sources are packed onto at most this many actors, so 300 sources cost a few actors.
DEFAULT_SOURCE_LOADER_ACTORS = 4

#: Package bytes a constructor prefetches per DP rank by default (sets prefetch_steps).
PREFETCH_BYTES = 64 << 20

#: The most steps ``prefetch_steps`` gets by default (Clients fetch half of it per call).
#: A Client call costs several ms of CPU over Ray's processes, most of it whatever the
#: call carries: on a 2-core machine, deployment CPU per token fell ~30 % from calls of
#: 32 steps (the earlier cap of 64) to 128, and again ~25 % to 256
#: (docs/internals/decisions/0006-large-fetches-in-one-buffer.md).  Bounded in bytes by
#: PREFETCH_BYTES first.
MAX_PREFETCH_STEPS = 512

_PlannerActor = ray.remote(Planner)
_SourceLoaderActor = ray.remote(SourceLoader)
_DataConstructorActor = ray.remote(DataConstructor)
_AutoscalerActor = ray.remote(Autoscaler)


_get = get  # ray.get with polyload's exceptions and a deadline


class Deployment:
    """The handle :func:`launch` returns: the actors of one deployment.

    Attributes:
        namespace, name: where the actors are registered (``ray.get_actor(name + ".planner",
            namespace=namespace)``).
        info: the layout (constructor names and DP groups, source partitions, nodes and
            pids of every actor).
    """

    def __init__(self, namespace: str, name: str, planner, loaders, constructors,
                 info: Dict[str, Any], shadows: Sequence[Any] = (), autoscaler=None,
                 constructor_shadows: Sequence[Any] = ()) -> None:
        self.namespace, self.name = namespace, name
        self._planner, self._loaders, self._constructors = planner, loaders, constructors
        self._shadows = list(shadows)
        self._ctor_shadows = list(constructor_shadows)  # by group, then standby index
        self._autoscaler = autoscaler
        self._info = info
        #: seconds any call of this handle waits for the actors (PolyloadTimeoutError)
        self.timeout = 300.0

    @property
    def info(self) -> Dict[str, Any]:
        """The layout (see the class doc); ``info["pids"]`` is asked of the actors at
        each access (5 s at most), so an actor Ray restarted shows its new process; while
        one cannot answer (mid-restart, or lost with its node) the last pids known stay."""
        if self._planner is not None:
            try:
                self._info["pids"] = {
                    role: [int(x) for x in ray.get([a.pid.remote() for a in handles],
                                                   timeout=5.0)]
                    for role, handles in self.actors.items() if role != "autoscaler"}
            except Exception:  # noqa: BLE001 - the last pids known
                pass
        return self._info

    @property
    def actors(self) -> Dict[str, List[Any]]:
        """Actor handles by role (``"shadow"``: the source loaders' standbys,
        ``"constructor_shadow"``: the constructors' standbys, by group), the
        source loaders being those of the routing table in use (the autoscaler adds
        and retires them)."""
        loaders, shadows = list(self._loaders), list(self._shadows)
        if self._autoscaler is not None and self._planner is not None:
            table = _get(self._autoscaler.table.remote(), self.timeout)
            live = table.live_slots()
            loaders = [ray.get_actor(table.slots[j][0], namespace=self.namespace)
                       for j in live]
            shadows = [ray.get_actor(n, namespace=self.namespace)
                       for j in live for n in table.slots[j][1:]]
        out = {"planner": [self._planner], "source_loader": loaders,
               "constructor": list(self._constructors), "shadow": shadows,
               "constructor_shadow": list(self._ctor_shadows)}
        if self._autoscaler is not None:
            out["autoscaler"] = [self._autoscaler]
        return out

    def scale(self, source: str, n: Optional[int]) -> Dict[str, Any]:
        """Give source ``source`` ``n`` dedicated source loaders now (its documents split
        into ``n`` equal index ranges, one per loader; 0: back on the shared loaders the
        deployment started with) and keep it there, the autoscaling policy leaving it
        alone, until ``scale(source, None)`` hands it back.  Batches do not change.
        Returns :meth:`scaling`'s view once the new loaders serve.

        Raises:
            ValueError: an unknown source or ``n < 0``.
        """
        self._check_scaler()
        return _get(self._autoscaler.scale.remote(source, n), self.timeout)

    def scaling(self) -> Dict[str, Any]:
        """The autoscaler's view: per source (``"sources"``: weight now, loaders,
        dedicated loaders, partitions, utilization (busy fraction), measured cost in
        CPU-seconds per token, the policy's target, a manual pin), the trainers'
        compute step time (s), data wait (fraction of the step), queue depth (steps
        built ahead), the routing version, CPU-seconds reserved by dedicated loaders,
        the live slots (actors and partitions), every scaling decision with its
        time, step and reason, and the final cost profile of each loader retired
        since the autoscaler actor last started (``"retired_loaders"``, the last
        1,000: actor (standbys included), time, step, ``cpu_s``, ``read_cpu_s``,
        ``wall_s``, ``busy_s`` and ``sources``, by source name the counters of
        ``SourceLoader.profile()``; a loader that did not answer has ``"error"``
        instead).  A source's ``held_by_margin`` is true while its pool is kept above
        the formula's size because one loader fewer would not hold the need with
        ``down_margin``.  Shown live by ``polyload top``."""
        self._check_scaler()
        return _get(self._autoscaler.view.remote(), self.timeout)

    def _check_scaler(self) -> None:
        self._check_open()
        if self._autoscaler is None:
            raise polyload.PolyloadError(
                _core.EINVAL, "EINVAL",
                f"deployment {self.namespace}/{self.name} has no autoscaler actor "
                f"({_registry.autoscaler(self.name)}): it was launched by an older polyload")

    def failovers(self) -> List[Dict[str, Any]]:
        """Every read a constructor moved to a standby: ``{"constructor", "slot",
        "from", "to", "reason", "time"}``."""
        self._check_open()
        out = []
        for g, grp in enumerate(self._groups()):
            for log in self._ask(grp, "failover_log"):  # a lost one's log went with it
                out += [dict(f, constructor=g) for f in log or []]
        return out

    def _ask(self, actors: Sequence[Any], method: str, *args) -> List[Any]:
        """``actor.method(*args)`` of every actor at once; None for one whose process is
        lost (a standby on a lost node, restarting): only standbys are asked this way."""
        refs = [getattr(a, method).remote(*args) for a in actors]
        out = []
        for r in refs:
            try:
                out.append(_get(r, self.timeout))
            except Exception as e:  # noqa: BLE001 - lost: None; other errors raise
                if not actor_lost(unwrap(e)):
                    raise
                out.append(None)
        return out

    def _groups(self) -> List[List[Any]]:
        """Per DP group: its constructor, then its standbys."""
        k = len(self._ctor_shadows) // max(1, len(self._constructors))
        return [[c] + self._ctor_shadows[g * k:(g + 1) * k]
                for g, c in enumerate(self._constructors)]

    def _check_open(self) -> None:
        if self._planner is None:
            raise polyload.PolyloadError(_core.ECLOSED, "ECLOSED",
                                         f"deployment {self.namespace}/{self.name} is shut down")

    def state_dict(self) -> Dict[str, Any]:
        """``{"version": 1, "blob": bytes}``: the state after the steps every
        constructor has delivered to all its ranks (a trainer's ``Client.state_dict()``
        is exact for its own position; this one may lead it by the steps a client
        prefetched)."""
        self._check_open()
        pos = []
        for grp in self._groups():  # the constructor serving each group (a standby
            # that took over, or both while a lost one comes back: the one ahead)
            serving = [p for p in self._ask(grp, "position") if p is not None]
            if not serving:  # a standby activates on its first call
                serving = [_get(grp[0].position.remote(True), self.timeout)]
            pos.append(max(serving, key=lambda p: (p[0], p[1], p[2])))
        gen, step, mb = min(pos, key=lambda p: (p[1], p[2]))
        blob = _core.state_unpack(_get(self._planner.state.remote(gen, step), self.timeout))
        dp = _core.state_info(blob)["dp"]
        return {"version": polyload.STATE_VERSION,
                "blob": _core.state_retarget(blob, mb, dp) if mb else blob}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart every actor from ``state`` (always, even when it is the state the
        deployment stands at).  Clients then call their own ``load_state_dict`` with the
        same state (which joins this restart) to take up the position."""
        self._check_open()
        gen, _ = _get(self._planner.restart.remote(_state_blob(state), True),
                      self.timeout)
        self._ask([c for grp in self._groups() for c in grp], "sync", gen)

    def pids(self) -> Dict[str, List[int]]:
        """Process ids of the actors, by role."""
        self._check_open()
        return {role: [int(x) for x in _get([a.pid.remote() for a in handles], self.timeout)]
                for role, handles in self.actors.items()}

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop and kill every actor of the deployment (idempotent)."""
        if self._planner is None:
            return
        handles = [self._planner] + list(self._loaders) + list(self._constructors) + \
            list(self._ctor_shadows) + list(self._shadows) + \
            ([self._autoscaler] if self._autoscaler is not None else [])
        try:  # the autoscaler first (it starts no more loaders), then the constructors
            if self._autoscaler is not None:
                ray.get(self._autoscaler.close.remote(), timeout=timeout)
            ray.get([h.close.remote() for h in self._constructors + self._ctor_shadows],
                    timeout=timeout)
        except Exception:  # noqa: BLE001 - killing anyway
            pass
        # every actor named NAME.* in the namespace: also loaders the autoscaler started
        try:
            from ray.util import list_named_actors  # noqa: PLC0415

            mine = _registry.actor_pattern(self.name)
            for a in list_named_actors(all_namespaces=True):
                if a.get("namespace") == self.namespace and mine.match(a.get("name", "")):
                    try:
                        handles.append(ray.get_actor(a["name"], namespace=self.namespace))
                    except Exception:  # noqa: BLE001 - gone meanwhile
                        pass
        except Exception:  # noqa: BLE001
            pass
        for h in handles:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        _registry.forget(self.namespace, self.name)
        self._planner, self._loaders, self._constructors, self._shadows = None, [], [], []
        self._ctor_shadows = []
        self._autoscaler = None

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        if self._planner is not None:
            self.shutdown()

    def __repr__(self) -> str:
        return (f"<polyload.ray.Deployment {self.namespace}/{self.name} "
                f"source_loaders={len(self._loaders)} constructors={len(self._constructors)}>")


def launch(
    config,
    num_source_loaders: Union[None, int, Mapping[str, int]] = None,
    num_constructors: int = 1,
    namespace: str = "polyload",
    *,
    name: str = "polyload",
    placement: Optional[Mapping[str, Mapping[str, Any]]] = None,
    prefetch_steps: Optional[int] = None,
    max_source_loader_actors: Optional[int] = None,
    max_lag_steps: Optional[int] = None,
    detached: bool = False,
    timeout: Optional[float] = 300.0,
    shadows: int = 1,
    constructor_shadows: int = 1,
    read_timeout: float = 30.0,
    checkpoint_steps: int = 8,
    autoscale: Union[None, bool, Mapping[str, Any]] = None,
) -> Deployment:
    """Start a deployment: one planner, source loaders, ``num_constructors`` constructors.

    Args:
        config: a YAML path or a dict (SPEC section 5).  Relative source paths are
            relative to the current directory, on every node.
        num_source_loaders: partitions per source (by index ranges): an int for every
            source or ``{source name: count}`` (missing sources: 1), each partition on an
            actor of its own unless ``max_source_loader_actors`` packs them.  Default: one
            partition per source, packed onto at most ``DEFAULT_SOURCE_LOADER_ACTORS``
            actors.
        num_constructors: data constructors; DP ranks are split into this many contiguous
            groups (at most ``topology.dp``).  Each serves its DP ranks and their TP, PP
            and CP peers.
        namespace, name: actors are named ``NAME.planner``, ``NAME.source_loader.J``,
            ``NAME.constructor.G`` in the Ray namespace, so :class:`Client` finds them.
        placement: Ray options per role (``"planner"``, ``"source_loader"``,
            ``"constructor"``): e.g. ``{"source_loader": {"resources": {"cpu_node": 1}}}``,
            ``{"constructor": {"node_id": "..."}}``, ``label_selector``, ``num_cpus``.
            CPUs default to ``DEFAULT_NUM_CPUS`` per role.
        prefetch_steps: steps a constructor builds ahead of its slowest rank (bounded
            queue; back-pressure beyond).  Default: about ``PREFETCH_BYTES`` (64 MiB) of
            packages per DP rank, 4 to ``MAX_PREFETCH_STEPS`` (512) steps (at least the
            config's ``prefetch``).
            Clients fetch half of it per call.
        max_source_loader_actors: host the partitions on at most this many actors
            (round-robin).
        max_lag_steps: the lag policy (``pl_pipeline``): a rank more than this many steps
            behind the most advanced rank of its DP rank is dropped and gets LagError,
            alone; default the config's ``max_lag_steps``.
        detached: actors outlive the process that launched them (``polyload serve``).
        shadows: warm standbys per source-loader actor (same partitions, sources open,
            on another node when there is one; they reserve no CPU, since they read only
            when their primary is gone).  A read whose actor is lost (killed, crashed,
            its node gone) or gives no answer within ``read_timeout`` seconds moves to
            the next standby in the same step; Ray restarts the lost actor in the
            background (``max_restarts``) and it serves again as a standby.  A
            standby holds no loaded tokenizer and no index pages until it takes over
            (it loads a raw text source's tokenizer at its first tokenization of it).
        constructor_shadows: warm standbys per data constructor
            (``NAME.constructor.G.shadow.K``: C objects built, on another node than
            the primary where there is one, no CPU reserved; they build nothing until
            used).  When a constructor's process is lost, its clients move to the next
            standby at once; it stands at the least step the group's ranks had not
            received (reported to the planner with each plan request) and rebuilds from
            there, while Ray restarts the lost actor, which becomes the standby.  With 0,
            clients wait for Ray's restart of the constructor (about a second).
        checkpoint_steps: the planner writes its checkpoint (the packed state of a
            step no rank is behind, its generation and registry) to Ray's internal KV
            store every this many steps; a restarted planner (Ray restarts every role
            whose process dies) continues from it, and a restarted constructor rebuilds
            from the least step its ranks stand at: batches do not change.
        autoscale: size each source's pool of source loaders by its measured cost,
            ahead of the mixture schedule (``polyload.ray._scale_policy``: feed-forward from
            the schedule and the measured CPU-seconds per token, feedback from the
            trainers' data wait, bounds and a CPU budget).  True, or a dict of
            ``polyload.ray.AUTOSCALE_DEFAULTS`` keys (``horizon_steps``, ``headroom``,
            ``loader_cpus``, ``min_loaders``, ``max_loaders``, ``cpu_budget``,
            ``placement``: Ray options of new loaders in preference order, e.g. spare
            CPUs of trainer nodes first, then CPU-only nodes, ...).  None: no policy;
            :meth:`Deployment.scale` still resizes pools by hand.  Batches are the same
            for any pools and across every scaling event.

    Ray: when it is not initialized in this process, ``launch`` starts it here
    (``ray.init(namespace=namespace)``) after :func:`set_failure_detection_env`.

    Raises:
        ConfigError, FormatError, PolyloadIOError: as the embedded loader, from the actor
            that opened the source (unwrapped from Ray's errors).
        ValueError: bad counts or placement, or CPU requests the cluster cannot meet.
        PolyloadTimeoutError: an actor did not answer within ``timeout`` seconds.
    """
    payload = config_payload(config)
    cfg = make_config(payload)  # ConfigError here, before anything starts
    dp = cfg.get_int("topology.dp")
    nmb = cfg.get_int("micro_batches_per_rank")
    if not 1 <= int(num_constructors) <= dp:
        raise ValueError(f"num_constructors must be in [1, dp={dp}], got {num_constructors}")
    if prefetch_steps is None:
        # Deep enough that few Ray calls carry many steps, bounded in bytes: about
        # PREFETCH_BYTES of packages per DP rank (2-byte tokens), 4 to
        # MAX_PREFETCH_STEPS steps.
        rank_step_bytes = 2.5 * cfg.get_int("global_batch_size") * cfg.get_int("seq_length") / dp
        prefetch_steps = int(min(MAX_PREFETCH_STEPS,
                                 max(4, PREFETCH_BYTES // max(1.0, rank_step_bytes))))
        prefetch_steps = max(prefetch_steps, -(-cfg.get_int("prefetch") // nmb))
    fetch_steps = max(1, int(prefetch_steps) // 2)  # steps per Client call
    if max_lag_steps is None:
        max_lag_steps = cfg.get_int("max_lag_steps")
    if num_source_loaders is None:
        num_source_loaders = 1
        if max_source_loader_actors is None:
            max_source_loader_actors = DEFAULT_SOURCE_LOADER_ACTORS
    if not ray.is_initialized():
        set_failure_detection_env()  # read by Ray when it starts in this process
        ray.init(namespace=namespace, include_dashboard=False)
    cwd = os.getcwd()
    common = {"namespace": namespace}
    if detached:
        common["lifetime"] = "detached"
    for role in ROLES:
        role_options(placement, role)  # validate early

    # Fast failure detection in every actor (FAILURE_DETECTION_ENV): through a
    # runtime_env only when the cluster's workers lack it (the planner, started first,
    # tells).
    env_needed = [False]

    def opts(role, actor_name, **extra):
        o = {"name": actor_name, **common, **extra}
        o.update(role_options(placement, role))
        return with_failure_detection(o, env_needed[0])

    user_placement = placement  # (standbys go to other nodes unless the caller placed them)
    placement = check_cpus(placement, int(num_constructors), num_source_loaders,
                           max_source_loader_actors, cfg.num_sources)
    scale_opts = autoscale_options(autoscale if autoscale is not None else {})
    if autoscale is None:
        scale_opts["enabled"] = False
    if int(shadows) < 0:
        raise ValueError(f"shadows must be >= 0, got {shadows}")
    if int(constructor_shadows) < 0:
        raise ValueError(f"constructor_shadows must be >= 0, got {constructor_shadows}")
    created = []
    # Every role restarts when its process dies (a crash, a kill, a lost node); calls
    # to the planner are retried on the new process, which recovers from its checkpoint.
    restart = {"max_restarts": -1}
    _registry.forget(namespace, name)  # a checkpoint of an earlier deployment
    # The actors get the config as a key of Ray's internal KV store, not inline: Ray
    # keeps creation arguments in the GCS and in every handle to an actor.
    payload = stored_payload(payload, _registry.config_key(namespace, name))
    try:
        planner_name = _registry.planner(name)
        planner = _PlannerActor.options(**opts("planner", planner_name), **restart,
                                        max_task_retries=-1).remote(
            payload, cwd, int(num_constructors), int(max_lag_steps),
            # States a rank may still need: the constructors' lag limit plus what runs
            # ahead of consumption (plans, builds and two Client calls).
            int(max_lag_steps) + 4 * int(prefetch_steps), int(checkpoint_steps))
        created.append(planner)
        pinfo = _get(planner.setup.remote(), timeout)
        env_needed[0] = not pinfo.get("failure_env", False)
        names = pinfo["names"]
        ScalePolicy(names, lambda s, t: 0.0, 1.0, scale_opts)  # bounds: ValueError now
        parts = launch_partitions(names, pinfo["num_documents"], num_source_loaders)
        n_actors = len(parts) if not max_source_loader_actors else \
            max(1, min(len(parts), int(max_source_loader_actors)))
        shards: List[List[Tuple[int, int, int]]] = [[] for _ in range(n_actors)]
        owner = []
        for j, p in enumerate(parts):
            shards[j % n_actors].append(p)
            owner.append(j % n_actors)
        loader_names = [_registry.source_loader(name, j) for j in range(n_actors)]
        loaders = []
        for j in range(n_actors):
            a = _SourceLoaderActor.options(**opts("source_loader", loader_names[j],
                                                  max_concurrency=2), **restart).remote(
                payload, cwd, shards[j])
            created.append(a)
            loaders.append(a)
        linfo = _get([a.setup.remote(True) for a in loaders], timeout)
        # Standbys, created now (not during an outage), on another node than their
        # primary where there is one.
        alive = alive_nodes()
        shadow_names: List[List[str]] = [[] for _ in range(n_actors)]
        shadow_actors = []
        for j in range(n_actors):
            for k in range(int(shadows)):
                role = "shadow" if placement and placement.get("shadow") else "source_loader"
                sname = _registry.source_loader(name, j, k)
                o = {"name": sname, **common, "max_concurrency": 2}
                o.update(role_options(placement, role) if role == "shadow" else
                         role_options(placement, "source_loader"))
                o["num_cpus"] = 0
                node = standby_node(alive, linfo[j]["node_id"], j + k)
                if not (user_placement and user_placement.get(role)) and node is not None:
                    o["scheduling_strategy"] = node_affinity(node, soft=True)
                a = _SourceLoaderActor.options(**with_failure_detection(o, env_needed[0]),
                                               **restart).remote(
                    payload, cwd, shards[j])
                created.append(a)
                shadow_actors.append(a)
                shadow_names[j].append(sname)
        sinfo = _get([a.setup.remote(True, standby=True) for a in shadow_actors], timeout)
        # Raw text sources: the planner asks their lengths of these loaders.
        table = RoutingTable(
            sources=list(names),
            partitions=[[names[s], lo, hi, owner[j]] for j, (s, lo, hi) in enumerate(parts)],
            slots=[[loader_names[j]] + shadow_names[j] for j in range(n_actors)],
            namespace=namespace, version=0)
        _get(planner.set_routing.remote(table), timeout)
        groups = [list(map(int, g)) for g in np.array_split(np.arange(dp), int(num_constructors))]
        ctor_names = [_registry.constructor(name, g) for g in range(len(groups))]
        ctor_shadow_names = [[_registry.constructor(name, g, k) for k in
                              range(int(constructor_shadows))] for g in range(len(groups))]
        ctors, ctor_shadows = [], []

        def make_ctor(g, group, actor_name, standby, o):
            return _DataConstructorActor.options(**o, **restart).remote(
                # the routing table comes from the planner (set above), not as
                # arguments, which Ray keeps in every handle (every trainer's client)
                payload, cwd, g, group, planner_name, [], None,
                pinfo["dtypes"], namespace, prefetch_steps,
                # Delivery runs ahead of consumption by up to two Client calls: the
                # constructor's lag limit leaves room for them.
                int(max_lag_steps) + 2 * fetch_steps, 1, float(read_timeout), standby,
                [ctor_names[g]] + ctor_shadow_names[g])

        for g, group in enumerate(groups):
            a = make_ctor(g, group, ctor_names[g], False, opts("constructor", ctor_names[g]))
            created.append(a)
            ctors.append(a)
        cinfo = _get([a.setup.remote() for a in ctors], timeout)
        for g, group in enumerate(groups):
            for k, sname in enumerate(ctor_shadow_names[g]):
                o = opts("constructor", sname)
                o["num_cpus"] = 0  # builds only once its primary is gone
                node = standby_node(alive, cinfo[g]["node_id"], g + k)
                if not (user_placement and user_placement.get("constructor")) and node is not None:
                    o["scheduling_strategy"] = node_affinity(node, soft=True)
                a = make_ctor(g, group, sname, True, o)
                created.append(a)
                ctor_shadows.append(a)
        csinfo = _get([a.setup.remote() for a in ctor_shadows], timeout)
        # The scaling role: owns the routing table from now on (Deployment.scale, and
        # the policy when autoscale is given).
        autoscaler = _AutoscalerActor.options(
            **with_failure_detection({"name": _registry.autoscaler(name), **common,
                                      "num_cpus": 0},
                                     env_needed[0]),
            **restart, max_task_retries=-1).remote(
            payload, cwd, name, namespace, table, pinfo["num_documents"], scale_opts,
            {**role_options(placement, "source_loader"), "_failure_env": env_needed[0]},
            int(shadows),
            bool(detached),
            [[ctor_names[g]] + ctor_shadow_names[g] for g in range(len(groups))])
        created.append(autoscaler)
        _get(autoscaler.setup.remote(), timeout)
        info = {
            "name": name,
            "namespace": namespace,
            "world_size": cfg.world_size(),
            "fingerprint": cfg.fingerprint(),
            "protocol": PROTOCOL,
            "polyload_version": polyload.__version__,
            "dp": dp,
            "micro_batches_per_rank": nmb,
            "sources": names,
            "num_constructors": len(ctors),
            "constructors": ctor_names,
            "constructor_shadows": ctor_shadow_names,
            "dp_groups": groups,
            "source_loaders": loader_names,
            "shadows": shadow_names,
            "partitions": [[names[s], lo, hi, owner[j]] for j, (s, lo, hi) in enumerate(parts)],
            "prefetch_steps": prefetch_steps,
            "max_lag_steps": int(max_lag_steps),
            "fetch_steps": fetch_steps,
            "read_timeout": float(read_timeout),
            "nodes": {"planner": [pinfo["node_id"]],
                      "source_loader": [x["node_id"] for x in linfo],
                      "constructor": [x["node_id"] for x in cinfo]},
            "pids": {"planner": [pinfo["pid"]],
                     "source_loader": [x["pid"] for x in linfo],
                     "shadow": [x["pid"] for x in sinfo],
                     "constructor": [x["pid"] for x in cinfo],
                     "constructor_shadow": [x["pid"] for x in csinfo]},
        }
        _get(planner.set_info.remote(info), timeout)
    except BaseException:
        for a in created:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        # ray.kill returns before the GCS has the actor dead (and its name free): wait
        # (10 s at most) until a call to each fails, so no actor is left when this raises
        deadline = time.monotonic() + 10.0
        for a in created:
            while time.monotonic() < deadline:
                try:
                    ray.get(a.pid.remote(), timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - dead (or not answering): gone
                    break
                time.sleep(0.05)
        raise
    dep = Deployment(namespace, name, planner, loaders, ctors, info, shadow_actors, autoscaler,
                     ctor_shadows)
    if timeout is not None:
        dep.timeout = float(timeout)
    return dep


def attach(name: str = "polyload", namespace: str = "polyload", *,
           timeout: Optional[float] = 300.0) -> Deployment:
    """A :class:`Deployment` handle on a running deployment started elsewhere (by
    ``launch(..., detached=True)``, ``polyload serve``, or another process of the
    cluster): found by its actors' names, so this process can scale it, read its
    scaling view, take or load its state and shut it down.  Starts Ray in this process
    (after :func:`set_failure_detection_env`) when it is not initialized.

    Raises:
        ValueError: no deployment ``namespace``/``name`` (no actor ``NAME.planner``).
        PolyloadTimeoutError: the planner did not answer within ``timeout`` seconds.
    """
    if not ray.is_initialized():
        set_failure_detection_env()  # read by Ray when it starts in this process
        ray.init(namespace=namespace, include_dashboard=False)
    try:
        planner = ray.get_actor(_registry.planner(name), namespace=namespace)
    except ValueError:
        raise ValueError(f"polyload.ray.attach: no deployment {namespace}/{name} "
                         f"(no actor {_registry.planner(name)})") from None
    info = _get(planner.info.remote(), timeout)
    ctors = [ray.get_actor(n, namespace=namespace) for n in info["constructors"]]
    try:
        scaler = ray.get_actor(_registry.autoscaler(name), namespace=namespace)
    except ValueError:
        scaler = None
    table = _get(planner.routing.remote(), timeout)
    live = table.live_slots()
    loaders = [ray.get_actor(table.slots[j][0], namespace=namespace) for j in live]
    shadows = [ray.get_actor(n, namespace=namespace) for j in live
               for n in table.slots[j][1:]]
    ctor_shadows = [ray.get_actor(n, namespace=namespace)
                    for grp in info.get("constructor_shadows", []) for n in grp]
    dep = Deployment(namespace, name, planner, loaders, ctors, info, shadows, scaler,
                     ctor_shadows)
    if timeout is not None:
        dep.timeout = float(timeout)
    return dep
