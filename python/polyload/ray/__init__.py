"""polyload on Ray: source loaders, one planner and data constructors as actors.

The roles of the embedded loader (docs/internals/design.md, "Roles") in separate
processes, possibly on separate machines.  Ray is the engine (placement, process
lifecycle, object transfer); polyload adds no cluster manager or RPC of its own.

- :class:`SourceLoader` actors host the sources (one source, or index-range partitions of
  it) and answer token ranges; they hold no training progress.
- The :class:`Planner` actor opens the sources for document lengths only and emits one
  encoded plan per step (``pl_plan_encode``); it never sees a payload.
- :class:`DataConstructor` actors, one per group of DP ranks, host the C pipeline
  (``pl_pipeline``: which step to plan, which unit to build, back-pressure, the lag
  policy), fetch plans, ask the source loaders for each DP rank's reads once per step
  (``pl_plan_step_reads``, ``pl_source_read_raw``) and pack the tokens with the rank's
  plan into one package per DP rank and step (``pl_package_encode``; no state blob: the
  planner keeps each step's state once and a :class:`Client` fetches it when
  ``state_dict()`` or ``stats()`` needs it), which every TP, PP and CP peer of that DP
  rank fetches as the result of its own call.
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
"""

import ray as _ray

from ._common import FAILURE_DETECTION_ENV, set_failure_detection_env

if not _ray.is_initialized():
    # Calls to a crashed actor fail in tens of milliseconds in this process (read when
    # ray.init starts Ray here; see FAILURE_DETECTION_ENV).
    set_failure_detection_env()

from ._actors import DataConstructor, Planner, SourceLoader  # noqa: E402
from ._client import Client  # noqa: E402
from ._deploy import (AUTOSCALE_DEFAULTS, DEFAULT_NUM_CPUS, DEFAULT_SOURCE_LOADER_ACTORS,
                      PREFETCH_BYTES, Deployment, attach, launch)
from ._scale import Autoscaler, ScalePolicy  # noqa: E402
from .serve import serve  # noqa: E402

__all__ = ["launch", "attach", "Deployment", "Client", "SourceLoader", "Planner",
           "DataConstructor",
           "serve", "Autoscaler", "ScalePolicy", "AUTOSCALE_DEFAULTS", "DEFAULT_NUM_CPUS",
           "DEFAULT_SOURCE_LOADER_ACTORS", "PREFETCH_BYTES", "FAILURE_DETECTION_ENV"]
