"""polyload on Ray: source loaders, one planner and data constructors as actors.

The roles of the embedded loader (docs/internals/design.md, "Roles") in separate
processes, possibly on separate machines.  Ray is the engine (placement, process
lifecycle, object transfer); polyload adds no cluster manager or RPC of its own.

- :class:`SourceLoader` actors host the sources (one source, or index-range partitions of
  it) and answer token ranges; they hold no training progress.
- The :class:`Planner` actor opens the sources for document lengths only and emits one
  encoded plan per step (``pl_plan_encode``); it never sees a payload.  It keeps the
  state blob of each step's start, which trainers fetch only when ``state_dict()`` or
  ``stats()`` need it.
- :class:`DataConstructor` actors, one per group of DP ranks, host the C pipeline
  (``pl_pipeline``: which step to plan, which unit to build, back-pressure, the lag
  policy), fetch plans, ask the source loaders for each DP rank's reads once per step
  (``pl_plan_step_reads``, ``pl_source_read_raw``) and pack them with the rank's plan
  into one package per DP rank and step (``pl_package_encode``; packages carry no state
  blob: the planner keeps each step's state and a :class:`Client` fetches it when
  ``state_dict()`` or ``stats()`` needs it), which every TP, PP and CP peer of that DP
  rank fetches as the result of its own call.
- The :class:`Autoscaler` actor owns the routing table (which source loader reads which
  documents) and sizes each source's pool of loaders (:class:`ScalePolicy`).
- :class:`Client` is a trainer rank's iterator: the embedded loader in external mode
  (``pl_loader_push_package``), so batches, states and statistics are the embedded
  loader's by construction.

Payloads travel source loader -> constructor -> trainer through Ray's object store as
tokens at their stored width (zero-copy on one node) and become the SPEC section 3 fields
in C at the trainer.  The state blob is the embedded loader's (SPEC section 4)::

    # once, anywhere in the cluster (or: polyload serve CONFIG --ray-address ADDR)
    deployment = polyload.ray.launch("mix.yaml", num_source_loaders=2, num_constructors=2)
    # in every trainer process: the one line that changes
    loader = polyload.ray.Client("mix.yaml")          # was: polyload.Loader("mix.yaml")
    for batch in loader: ...

Failure detection: calls to a crashed actor fail in tens of milliseconds when Ray runs
with :data:`FAILURE_DETECTION_ENV`.  :func:`launch`, :func:`attach`, :class:`Client`,
``polyload serve`` and ``polyload top`` set it (:func:`set_failure_detection_env`)
before they start Ray in their process; a program that calls ``ray.init`` or starts a
cluster itself calls :func:`set_failure_detection_env` before.  Importing this package
changes no environment variable and imports Ray only when a name that needs it is first
used (so :class:`ScalePolicy` works without Ray).

Modules: ``_deploy`` (launch, attach, Deployment), ``_client`` (Client), the roles
``_planner``, ``_source_loader``, ``_constructor`` (with ``_reads``) and
``_autoscaler``; ``_scale_policy`` (the policy, no Ray), ``_routing`` (the routing
table), ``_registry`` (actor names and key-value store keys), ``_placement``,
``_protocol`` (what travels to Clients), ``_config`` (the config as actors receive it),
``_calls`` (waits and errors of actor calls), ``_failure``; ``serve`` and ``top`` (CLIs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

from ._failure import FAILURE_DETECTION_ENV, set_failure_detection_env
from ._placement import DEFAULT_NUM_CPUS
from ._scale_policy import DEFAULTS as AUTOSCALE_DEFAULTS
from ._scale_policy import ScalePolicy
from .serve import serve

if TYPE_CHECKING:  # pragma: no cover - for type checkers; imported lazily below
    from ._autoscaler import Autoscaler
    from ._client import Client
    from ._constructor import DataConstructor
    from ._deploy import (DEFAULT_SOURCE_LOADER_ACTORS, PREFETCH_BYTES, Deployment, attach,
                          launch)
    from ._planner import Planner
    from ._source_loader import SourceLoader

__all__ = ["launch", "attach", "Deployment", "Client", "SourceLoader", "Planner",
           "DataConstructor",
           "serve", "Autoscaler", "ScalePolicy", "AUTOSCALE_DEFAULTS", "DEFAULT_NUM_CPUS",
           "DEFAULT_SOURCE_LOADER_ACTORS", "PREFETCH_BYTES", "FAILURE_DETECTION_ENV",
           "set_failure_detection_env"]

#: The names that need Ray, and the module that holds each: imported at first use.
_LAZY = {"launch": "_deploy", "attach": "_deploy", "Deployment": "_deploy",
         "DEFAULT_SOURCE_LOADER_ACTORS": "_deploy", "PREFETCH_BYTES": "_deploy",
         "Client": "_client", "SourceLoader": "_source_loader", "Planner": "_planner",
         "DataConstructor": "_constructor", "Autoscaler": "_autoscaler"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))
