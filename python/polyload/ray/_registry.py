"""Where a deployment lives: the names of its actors in the Ray namespace and its keys
in Ray's internal key-value store.  Every actor name and every key is built here.

A deployment ``NAME`` in namespace ``NS`` has the actors ``NAME.planner``,
``NAME.autoscaler``, ``NAME.source_loader.J`` (slot J) and ``NAME.constructor.G`` (DP
group G), standbys adding ``.shadow.K``; and the keys ``polyload:NS:NAME.config`` (the
config payload), ``polyload:NS:NAME.planner`` (the planner's checkpoint) and
``polyload:NS:NAME.source_loader.J[.shadow.K].shards`` (a source loader's partitions).
Values are pickled.  Ray is imported when a key is read or written.
"""

from __future__ import annotations

import pickle
import re
from typing import Any, List, Optional

# ------------------------------------------------------------------ actor names


def planner(name: str) -> str:
    """The planner's actor name."""
    return f"{name}.planner"


def autoscaler(name: str) -> str:
    """The autoscaler's actor name."""
    return f"{name}.autoscaler"


def source_loader(name: str, slot: int, shadow: Optional[int] = None) -> str:
    """Actor name of slot ``slot``'s source loader, or of its standby ``shadow``."""
    base = f"{name}.source_loader.{slot}"
    return base if shadow is None else f"{base}.shadow.{shadow}"


def source_loader_slot(name: str, slot: int, shadows: int) -> List[str]:
    """A slot's actor names: its source loader, then its ``shadows`` standbys."""
    return [source_loader(name, slot)] + [source_loader(name, slot, k) for k in range(shadows)]


def slot_of(name: str, actor: str) -> Optional[int]:
    """The slot of a source-loader actor name of deployment ``name`` (a standby's too);
    None for another name."""
    prefix = f"{name}.source_loader."
    if not actor.startswith(prefix):
        return None
    try:
        return int(actor[len(prefix):].split(".")[0])
    except ValueError:
        return None


def constructor(name: str, group: int, shadow: Optional[int] = None) -> str:
    """Actor name of DP group ``group``'s data constructor, or of its standby ``shadow``."""
    base = f"{name}.constructor.{group}"
    return base if shadow is None else f"{base}.shadow.{shadow}"


def actor_pattern(name: str) -> "re.Pattern[str]":
    """A pattern matching the name of every actor of deployment ``name``."""
    return re.compile(re.escape(name) + r"\.(planner|autoscaler|"
                      r"(constructor|source_loader)\.\d+(\.shadow\.\d+)?)$")


# ------------------------------------------------------------ key-value store keys


def config_key(namespace: str, name: str) -> bytes:
    """Where a deployment's config payload lives."""
    return f"polyload:{namespace}:{name}.config".encode()


def checkpoint_key(namespace: str, planner_actor: str) -> bytes:
    """Where the planner actor ``planner_actor`` keeps its checkpoint."""
    return f"polyload:{namespace}:{planner_actor}".encode()


def shards_key(namespace: str, loader_actor: str) -> bytes:
    """Where the source-loader actor ``loader_actor`` keeps its partitions."""
    return f"polyload:{namespace}:{loader_actor}.shards".encode()


def shards_prefix(namespace: str, name: str) -> bytes:
    """The prefix of every source loader's partitions key of deployment ``name``."""
    return f"polyload:{namespace}:{name}.source_loader.".encode()


# ------------------------------------------------------------ key-value store access


def kv_get(key: bytes) -> Any:
    """The unpickled value at ``key``, None when there is none."""
    from ray.experimental import internal_kv  # noqa: PLC0415

    data = internal_kv._internal_kv_get(key)
    return pickle.loads(data) if data else None


def kv_put(key: bytes, data: bytes) -> None:
    """Store ``data`` (pickled by the caller) at ``key``, replacing what was there."""
    from ray.experimental import internal_kv  # noqa: PLC0415

    internal_kv._internal_kv_put(key, data, overwrite=True)


def kv_del(key: bytes, prefix: bool = False) -> None:
    """Delete ``key`` (``prefix``: every key that starts with it)."""
    from ray.experimental import internal_kv  # noqa: PLC0415

    if prefix:
        internal_kv._internal_kv_del(key, del_by_prefix=True)
    else:
        internal_kv._internal_kv_del(key)


def forget(namespace: str, name: str) -> None:
    """Delete what a deployment keeps in the store: the planner's checkpoint, the
    source loaders' partitions and the config."""
    kv_del(checkpoint_key(namespace, planner(name)))
    kv_del(config_key(namespace, name))
    kv_del(shards_prefix(namespace, name), prefix=True)
