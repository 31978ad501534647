"""polyload on Ray: source loaders, one planner and data constructors as actors.

The roles of the embedded loader (DESIGN.md, "Roles") in separate processes, possibly on
separate machines.  Ray is the engine (placement, process lifecycle, object transfer);
polyload adds no cluster manager or RPC of its own.

- :class:`SourceLoader` actors host the sources (one source, or index-range partitions of
  it) and answer token ranges; they hold no training progress.
- The :class:`Planner` actor opens the sources for document lengths only and emits one
  encoded plan per step (``pl_plan_encode``); it never sees a payload.
- :class:`DataConstructor` actors, one per group of DP ranks, fetch plans, ask the source
  loaders for the ranges of their ranks' micro-batches (``pl_plan_reads``,
  ``pl_source_read_many``), build them (``pl_constructor_build``) a bounded number of
  steps ahead, and serve every rank of the group (TP, PP and CP peers included).
- :class:`Client` is a trainer rank's iterator, with the interface of
  :class:`polyload.Loader`.

Payloads travel source loader -> constructor -> trainer through Ray's object store (NumPy
arrays; zero-copy on one node).  Batches equal the embedded loader's bit for bit, and the
state blob is the embedded loader's (SPEC section 4)::

    # once, anywhere in the cluster (or: polyload serve CONFIG --ray-address ADDR)
    deployment = polyload.ray.launch("mix.yaml", num_source_loaders=2, num_constructors=2)
    # in every trainer process: the one line that changes
    loader = polyload.ray.Client("mix.yaml")          # was: polyload.Loader("mix.yaml")
    for batch in loader: ...
"""

from ._actors import DataConstructor, Planner, SourceLoader
from ._client import Client
from ._deploy import Deployment, launch
from .serve import serve

__all__ = ["launch", "Deployment", "Client", "SourceLoader", "Planner", "DataConstructor",
           "serve"]
