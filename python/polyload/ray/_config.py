"""The config as the actors receive it: a payload that travels (:func:`config_payload`,
kept once in Ray's key-value store by :func:`stored_payload`), turned back into a C
config inside each actor (:func:`make_config`); the directory relative source paths
start from (:func:`enter_cwd`); the digest of the source names a Client compares
(:func:`sources_digest`)."""

from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any, Mapping, Tuple

import polyload
from polyload._config import _make_config

from . import _registry


def config_payload(config) -> Tuple[str, Any, str]:
    """What an actor needs to rebuild the config in its own process: ``("yaml", text,
    origin)`` for a path, ``("dict", dict, "<dict>")`` for a mapping.  C handles
    (``polyload._core.Config``) are never pickled.

    Raises:
        TypeError: ``config`` is neither a path nor a mapping.
        OSError: the YAML file cannot be read.
    """
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
    _registry.kv_put(key, pickle.dumps(tuple(payload)))
    return ("kv", key, payload[2])


def make_config(payload):
    """A ``polyload._core.Config`` from :func:`config_payload`'s tuple, or from
    :func:`stored_payload`'s stand-in (read from Ray's internal KV store).

    Raises:
        ConfigError: the config is invalid, or the stand-in's key is gone (the
            deployment was shut down).
    """
    kind, value, origin = payload
    if kind == "kv":
        stored = _registry.kv_get(value)
        if not stored:
            raise polyload.ConfigError(
                polyload._core.ECONFIG, "ECONFIG",
                f"polyload.ray: the deployment's config ({origin}) is no longer in Ray's "
                f"internal KV store (key {value!r}): the deployment was shut down")
        kind, value, origin = stored
    if kind == "dict":
        return _make_config(value)
    return polyload._core.Config.parse_string(value, origin=origin)


def enter_cwd(cwd: str) -> None:
    """Relative source paths are relative to the current directory of the process that
    launched the deployment (as for the embedded loader); actors work from there when
    the directory exists on their node, so the state blob's source paths are the same."""
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
