"""Pieces shared by the actors, the deployment and the client of :mod:`polyload.ray`.

Nothing here imports Ray at module level except :func:`unwrap`, which imports it lazily.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Mapping, Tuple

import polyload

def config_payload(config) -> Tuple[str, Any, str]:
    """What an actor needs to rebuild the config in its own process: ``("yaml", text,
    origin)`` for a path, ``("dict", dict, "<dict>")`` for a mapping.  C handles
    (``polyload._core.Config``) are never pickled."""
    if isinstance(config, Mapping):
        return ("dict", dict(config), "<dict>")
    if isinstance(config, (str, bytes, os.PathLike)):
        path = os.fsdecode(config)
        with open(path, "r", encoding="utf-8") as f:
            return ("yaml", f.read(), path)
    raise TypeError(
        "polyload.ray needs the config as a YAML path or a dict (a polyload._core.Config "
        f"cannot travel to other processes), not {type(config).__name__}"
    )


def sources_digest(names) -> str:
    """SHA-256 (hex) of a deployment's source names in order: what a Client compares
    with its config's instead of the list of names."""
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()


def stored_payload(payload: Tuple[str, Any, str], key: bytes) -> Tuple[str, Any, str]:
    """Keep ``payload`` (:func:`config_payload`'s tuple) in Ray's internal KV store
    under ``key`` and return the stand-in the actors get instead, ``("kv", key,
    origin)``, which :func:`make_config` resolves.  An actor's creation arguments are
    kept inline in its task spec by the GCS (for restarts) and by every process that
    holds a handle to the actor (``ray.get_actor``), so the config text of many sources
    would be copied into each of them; this way the GCS keeps one copy.  Needs Ray
    initialized."""
    import pickle  # noqa: PLC0415

    from ray.experimental import internal_kv  # noqa: PLC0415

    internal_kv._internal_kv_put(key, pickle.dumps(tuple(payload)), overwrite=True)
    return ("kv", key, payload[2])


def make_config(payload):
    """A ``polyload._core.Config`` from :func:`config_payload`'s tuple, or from
    :func:`stored_payload`'s stand-in (read from Ray's internal KV store)."""
    kind, value, origin = payload
    if kind == "kv":
        import pickle  # noqa: PLC0415

        from ray.experimental import internal_kv  # noqa: PLC0415

        data = internal_kv._internal_kv_get(value)
        if not data:
            raise polyload.ConfigError(
                polyload._core.ECONFIG, "ECONFIG",
                f"polyload.ray: the deployment's config ({origin}) is no longer in Ray's "
                f"internal KV store (key {value!r}): the deployment was shut down")
        kind, value, origin = pickle.loads(data)
    if kind == "dict":
        return polyload._make_config(value)
    return polyload._core.Config.parse_string(value, origin=origin)


def enter_cwd(cwd: str) -> None:
    """Relative source paths are relative to the current directory of the process that
    launched the deployment (as for the embedded loader); actors work from there when
    the directory exists on their node, so the state blob's source paths are the same."""
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)


def unwrap(exc: BaseException) -> BaseException:
    """The exception an actor raised, without Ray's ``RayTaskError`` wrappers, so the
    trainer sees ``polyload.FormatError`` etc. as the embedded loader raises them."""
    from ray.exceptions import RayTaskError  # noqa: PLC0415

    seen = 0
    while isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None and seen < 16:
        exc = exc.cause
        seen += 1
    return exc


class StoodDown(Exception):
    """Raised by a data constructor that no longer serves its group (another one of
    the group took over: ``DataConstructor.stand_down``) for the fetches it was
    answering; the Client moves to ``serving`` (the actor name of the one that took
    over, when known), else to the group's next constructor.  Never reaches the
    trainer."""

    def __init__(self, message: str, serving: "str | None" = None) -> None:
        super().__init__(message, serving)
        self.serving = serving

    def __str__(self) -> str:
        return str(self.args[0])


def actor_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says that an actor's process is gone or unreachable (killed,
    crashed, its node lost, restarting), rather than an error the actor raised."""
    import ray.exceptions as rex  # noqa: PLC0415

    kinds = tuple(k for k in (getattr(rex, n, None) for n in (
        "RayActorError", "ActorDiedError", "ActorUnavailableError", "OwnerDiedError",
        "ObjectLostError", "ObjectReconstructionFailedError", "NodeDiedError",
        "WorkerCrashedError", "LocalRayletDiedError")) if isinstance(k, type))
    return isinstance(exc, kinds)


def get(refs, timeout=None):
    """``ray.get`` with a deadline: polyload's own exceptions unwrapped from Ray's, and
    a timeout as PolyloadTimeoutError."""
    import ray  # noqa: PLC0415

    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise polyload.PolyloadTimeoutError(
            polyload._core.ETIMEDOUT, "ETIMEDOUT",
            f"polyload.ray: no answer from the deployment's actors within {timeout:g} s "
            f"({refs!r})") from None
    except Exception as e:  # noqa: BLE001 - polyload's own exception, unwrapped
        raise unwrap(e) from None


def routing_for_constructors(table):
    """``(routing, slot_names)`` of a routing table (``Planner.set_routing``'s dict):
    per source (partition starts, slot per partition) sorted by start, and per slot
    its actor's name then its standbys' (none for a retired slot: its actors are gone,
    and slot indices are never reused)."""
    index = {n: s for s, n in enumerate(table["sources"])}
    gone = set(int(j) for j in table.get("retired") or [])
    per: list = [[] for _ in table["sources"]]
    for name, lo, _hi, slot in table["partitions"]:
        per[index[name]].append((int(lo), int(slot)))
    routing = []
    for parts in per:
        parts.sort()
        routing.append(([lo for lo, _ in parts], [a for _, a in parts]))
    return routing, [[] if j in gone else list(x) for j, x in enumerate(table["slots"])]


#: The calls between a deployment's actors and its Clients: raised when what an actor
#: call takes or answers changes (2: ``DataConstructor.fetch`` may answer a fourth
#: element, the error of the step after its packages).  A Client refuses a deployment
#: of another protocol (e.g. one launched detached by an older polyload) with
#: ConfigError at connect, instead of failing later.
PROTOCOL = 2


#: Ray settings of the processes that call the actors (trainers' clients, constructors,
#: the planner), so that a crashed actor's calls fail in tens of milliseconds rather
#: than after Ray's default second: ``timeout_ms_task_wait_for_death_info`` (how long a
#: call whose connection broke waits for the GCS to say why; default 1000 ms) and
#: ``core_worker_internal_heartbeat_ms`` (how often that wait is checked; default
#: 1000 ms).  Measured here: a SIGKILLed actor's pending call fails after 35-41 ms with
#: these, 1.2-1.4 s without.  Set as environment variables, read when Ray starts in a
#: process: the actors get them through their runtime_env; ``import polyload.ray``
#: sets them (unless already set) in a process where Ray is not initialized yet.
FAILURE_DETECTION_ENV = {"RAY_timeout_ms_task_wait_for_death_info": "20",
                         "RAY_core_worker_internal_heartbeat_ms": "10"}


def set_failure_detection_env() -> None:
    """``FAILURE_DETECTION_ENV`` into ``os.environ`` (keys already set stay)."""
    for k, v in FAILURE_DETECTION_ENV.items():
        os.environ.setdefault(k, v)


def has_failure_detection_env() -> bool:
    """Whether this process runs with ``FAILURE_DETECTION_ENV`` (a Ray worker inherits
    it from the raylet's environment, e.g. ``RAY_...=20 ray start ...``, or from a
    cluster started by a process that imported ``polyload.ray`` first)."""
    return all(os.environ.get(k) == v for k, v in FAILURE_DETECTION_ENV.items())


def with_failure_detection(options: Dict[str, Any], needed: bool = True) -> Dict[str, Any]:
    """Actor options with ``FAILURE_DETECTION_ENV`` added to ``runtime_env["env_vars"]``
    (values the caller set stay), when ``needed``: the cluster's workers lack it.  A
    runtime_env costs a dedicated worker process per actor (measured: launch 4.9-7.0 s
    against 3.1-5.4 s), so launch adds it only then."""
    o = dict(options)
    if not needed:
        return o
    env = dict(o.get("runtime_env") or {})
    env["env_vars"] = {**FAILURE_DETECTION_ENV, **dict(env.get("env_vars") or {})}
    o["runtime_env"] = env
    return o
