"""Where the actors run and what they reserve: Ray options per role from ``launch``'s
``placement`` (:func:`role_options`), a check that the cluster has the CPUs the roles ask
for (:func:`check_cpus`), standbys on another node than their primary
(:func:`standby_node`), and the placement of the source loaders the autoscaler adds
(:class:`LoaderPlacement`).  Ray is imported when first needed."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

ROLES = ("planner", "source_loader", "constructor")
#: placement keys: the roles, and "shadow" for the source loaders' standbys (default:
#: the source loaders' options, on another node than the primary where there is one)
PLACEMENT_KEYS = ROLES + ("shadow",)

#: CPUs each role asks Ray for, unless ``placement[role]["num_cpus"]`` says otherwise:
#: source loaders read (and later tokenize and decode) and constructors route and pack
#: payloads, so both are CPU work; the planner works once per step.
DEFAULT_NUM_CPUS = {"planner": 0.25, "source_loader": 0.5, "constructor": 1.0, "shadow": 0.0}


def node_affinity(node_id: str, soft: bool):
    """Ray's scheduling strategy that puts an actor on node ``node_id`` (``soft``: or
    elsewhere when that node cannot host it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def role_options(placement: Optional[Mapping[str, Any]], role: str) -> Dict[str, Any]:
    """Ray actor options of a role from ``placement[role]``: ``resources``, ``num_cpus``,
    ``memory``, ``label_selector`` and other ``.options()`` keys pass through;
    ``node_id`` pins the role to a node (NodeAffinitySchedulingStrategy, hard).

    Raises:
        ValueError: ``placement`` names a role not in :data:`PLACEMENT_KEYS`.
    """
    if not placement:
        return {"num_cpus": DEFAULT_NUM_CPUS[role]}
    unknown = set(placement) - set(PLACEMENT_KEYS)
    if unknown:
        raise ValueError(f"placement: unknown roles {sorted(unknown)} (roles: {PLACEMENT_KEYS})")
    opts = dict(placement.get(role) or {})
    opts.setdefault("num_cpus", DEFAULT_NUM_CPUS[role])
    node_id = opts.pop("node_id", None)
    if node_id is not None:
        opts["scheduling_strategy"] = node_affinity(node_id, soft=False)
    return opts


def check_cpus(placement, n_ctors: int, num_source_loaders, max_actors,
               n_sources: int):
    """The placement to launch with.  A deployment whose CPU requests exceed the
    cluster's CPUs would wait forever for its actors to be scheduled: with the default
    requests (no ``placement``) every role's request is scaled down to fit, with a
    warning naming the numbers; requests the caller set are refused at once.

    Raises:
        ValueError: the caller's requests ask for more CPUs than the Ray cluster has
            (naming the numbers and the fix).
    """
    import math  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import ray  # noqa: PLC0415

    total = ray.cluster_resources().get("CPU", 0.0)
    if isinstance(num_source_loaders, Mapping):
        parts = sum(int(num_source_loaders.get(n, 1)) for n in num_source_loaders) + max(
            0, n_sources - len(num_source_loaders))
    else:
        parts = int(num_source_loaders) * n_sources
    n_loaders = parts if max_actors is None else min(parts, int(max_actors))
    cpus = {r: float(role_options(placement, r).get("num_cpus", DEFAULT_NUM_CPUS[r]))
            for r in ROLES}
    need = (cpus["planner"] + n_ctors * cpus["constructor"]
            + max(1, n_loaders) * cpus["source_loader"])
    if need > total + 1e-9 and not placement and total > 0:
        f = total / need
        scaled = {r: {"num_cpus": math.floor(DEFAULT_NUM_CPUS[r] * f * 1000) / 1000}
                  for r in ROLES}
        warnings.warn(
            f"polyload.ray.launch: the roles ask for {need:g} CPUs but the Ray cluster has "
            f"{total:g}: the requests are scaled by {f:.3f} to fit (planner "
            f"{scaled['planner']['num_cpus']:g}, constructor "
            f"{scaled['constructor']['num_cpus']:g}, source loader "
            f"{scaled['source_loader']['num_cpus']:g}); pass placement (polyload serve: "
            f"--num-cpus ROLE=N) to set them yourself", RuntimeWarning, stacklevel=4)
        return scaled
    if need > total + 1e-9:
        raise ValueError(
            f"polyload.ray.launch: the roles ask for {need:g} CPUs (planner {cpus['planner']:g}, "
            f"{n_ctors} constructor(s) x {cpus['constructor']:g}, source loaders x "
            f"{cpus['source_loader']:g}) but the Ray cluster has {total:g}; pass smaller "
            f"requests, e.g. placement={{'source_loader': {{'num_cpus': 0.25}}, "
            f"'constructor': {{'num_cpus': 0.5}}}}, or start Ray with more CPUs")
    return placement


def alive_nodes() -> List[str]:
    """The ids of the cluster's live nodes."""
    import ray  # noqa: PLC0415

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def standby_node(alive: Sequence[str], primary: str, k: int) -> Optional[str]:
    """The node of the ``k``-th standby of an actor on node ``primary``: the live nodes
    other than the primary's in turn (the primary's when it is the only one); None
    without live nodes."""
    others = [n for n in alive if n != primary] or list(alive)
    return others[k % len(others)] if others else None


class LoaderPlacement:
    """Ray options of the source loaders the autoscaler starts: the first entry of
    ``prefs`` (``autoscale["placement"]``, else launch's source-loader options) that
    some node can host now, the loader then pinned to that node, else the last entry
    as it is.  CPUs placed during a change are counted until :meth:`reset` (Ray's own
    figures would count them twice once it has scheduled them)."""

    def __init__(self, prefs: Optional[Sequence[Mapping[str, Any]]],
                 loader_options: Mapping[str, Any], loader_cpus: float) -> None:
        self._prefs = list(prefs) if prefs else [dict(loader_options)]
        self._loader_cpus = float(loader_cpus)
        self._reserved: Dict[Any, float] = {}  # CPUs of loaders being placed, by node
        self._avail: Optional[Dict[Any, Dict[str, float]]] = None  # snapshot of a change

    def cpus_per_loader(self) -> float:
        """CPUs a dedicated loader reserves: its placement's ``num_cpus``, else
        ``loader_cpus``."""
        p = self._prefs[0] or {}
        return float(p.get("num_cpus", self._loader_cpus))

    def reset(self) -> None:
        """A change is over: Ray's accounting has its loaders now."""
        self._reserved, self._avail = {}, None

    def pick(self, cpus: Optional[float] = None, avoid: Optional[str] = None) -> Dict[str, Any]:
        """Ray options of a new loader (``cpus``: its CPUs, default the entry's
        ``num_cpus`` or ``loader_cpus``; ``avoid``: a node tried last).  An entry that
        fits gets ``"node_id"``, which the caller turns into a scheduling strategy.  So
        ``[{"resources": {"trainer": 0.01}}, {"resources": {"cpu_only": 0.01}}]`` fills
        the spare CPUs of trainer nodes (sidecars) first, then CPU-only nodes."""
        import ray  # noqa: PLC0415

        prefs = self._prefs
        # One snapshot per change, less the loaders placed since (Ray's own figures
        # would count those twice once it has scheduled them).
        per_node = self._avail
        if per_node is None:
            try:
                from ray._private.state import available_resources_per_node  # noqa: PLC0415

                per_node = available_resources_per_node()
            except Exception:  # noqa: BLE001 - a Ray without it: the cluster's totals
                per_node = {None: ray.available_resources()}
            self._avail = per_node
        for p in prefs:
            p = dict(p or {})
            if "node_id" in p or "label_selector" in p or "scheduling_strategy" in p:
                return p  # placed by the caller's rule
            need = dict(p.get("resources") or {})
            need["CPU"] = float(p.get("num_cpus", self._loader_cpus)) \
                if cpus is None else float(cpus)
            nodes = sorted(per_node, key=lambda n: n == avoid)  # another node first
            for node in nodes:
                free = dict(per_node[node])
                free["CPU"] = free.get("CPU", 0.0) - self._reserved.get(node, 0.0)
                if all(free.get(k, 0.0) >= v - 1e-9 for k, v in need.items()):
                    if node is not None:
                        p["node_id"] = node
                        self._reserved[node] = self._reserved.get(node, 0.0) + need["CPU"]
                    return p
        return dict(prefs[-1] or {})
