"""``Client``: a trainer rank's view of a deployment, with the interface of
``polyload.Loader``."""

from __future__ import annotations

import collections
import os
import time
import warnings
from typing import Any, Deque, Dict, Iterator, Mapping, Optional, Tuple

import ray

import polyload
from polyload import _core

from ._common import blob_sources, unwrap

_ARRAY_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens")


def _get(refs, timeout: Optional[float] = None):
    try:
        return ray.get(refs, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - polyload's own exception, unwrapped
        raise unwrap(e) from None


class Client:
    """The micro-batches of one global rank from a running deployment (:func:`launch`).

    A drop-in for :class:`polyload.Loader`: iteration yields one dict per micro-batch
    (SPEC section 3; torch tensors, or NumPy arrays without torch), ending after
    ``train_steps``; ``state_dict``/``load_state_dict``, ``stats``, ``close`` and the
    context manager behave as the Loader's.  The batches are bit for bit the embedded
    loader's for the same config, whatever the numbers of actors.

    Args:
        config: the deployment's config (a YAML path or a dict); checked against the
            deployment's layout.
        rank: the global rank.  Default: ``torch.distributed.get_rank()`` when
            initialized, else ``$RANK``, else 0.
        namespace, name: where :func:`launch` registered the actors.
        pin_memory: as the Loader's (a copy into pinned memory; a no-op without CUDA).
        prefetch: requests in flight to the constructor beyond the current one (hides
            the round trip; the constructor itself prefetches whole steps).
        address: Ray address for ``ray.init`` when Ray is not initialized in this
            process (default: ``$RAY_ADDRESS`` or ``"auto"``).

    Tensors share the object store's memory on this node (no copy); they are read-only
    views, as the Loader's are shared: do not modify them in place.

    Raises:
        ConfigError: the config does not match the deployment.
        RangeError: ``rank`` is outside the topology.
        FormatError, PolyloadIOError, ...: errors of the actors, as the embedded loader
            raises them (unwrapped from Ray's ``RayTaskError``).
        ValueError: no deployment named ``name`` in ``namespace``.
    """

    def __init__(self, config, rank: Optional[int] = None, namespace: str = "polyload", *,
                 name: str = "polyload", pin_memory: bool = False, prefetch: int = 2,
                 address: Optional[str] = None) -> None:
        self._closed = True
        cfg = polyload._make_config(config)
        self.rank = polyload._default_rank() if rank is None else polyload._as_rank(rank)
        self.rank_info: Dict[str, int] = cfg.rank_info(self.rank)
        self.config = cfg
        self.world_size = cfg.world_size()
        if not ray.is_initialized():
            ray.init(address=address or os.environ.get("RAY_ADDRESS", "auto"),
                     namespace=namespace, include_dashboard=False,
                     log_to_driver=False)
        self._planner = ray.get_actor(f"{name}.planner", namespace=namespace)
        info = _get(self._planner.info.remote())
        names = [cfg.source_name(i) for i in range(cfg.num_sources)]
        nmb = cfg.get_int("micro_batches_per_rank")
        if (info.get("fingerprint") != cfg.fingerprint() or info.get("world_size") != self.world_size
                or info.get("sources") != names or info.get("micro_batches_per_rank") != nmb
                or info.get("dp") != cfg.get_int("topology.dp")):
            raise polyload.ConfigError(
                _core.ECONFIG, "ECONFIG",
                f"polyload.ray.Client: the config does not match deployment {namespace}/{name} "
                f"(a setting that decides the batches differs: world size {self.world_size} vs "
                f"{info.get('world_size')}, sources {names} vs {info.get('sources')}, "
                f"micro-batches per rank {nmb} vs {info.get('micro_batches_per_rank')}, "
                f"config fingerprint {cfg.fingerprint():#x} vs {info.get('fingerprint', 0):#x}; "
                f"only threads and prefetch may differ)")
        self.info = info
        self._nmb = nmb
        dp_rank = self.rank_info["dp_rank"]
        g = next(i for i, grp in enumerate(info["dp_groups"]) if dp_rank in grp)
        self._ctor = ray.get_actor(info["constructors"][g], namespace=namespace)
        self._prefetch = max(0, int(prefetch))
        self._torch = polyload._import_torch()
        self._pin = False
        if pin_memory:
            if self._torch is not None and self._torch.cuda.is_available():
                self._pin = True
            else:
                warnings.warn("polyload.ray.Client: pin_memory=True ignored (torch without CUDA)",
                              RuntimeWarning, stacklevel=2)
        gen, start_k = _get(self._planner.current.remote())
        self._closed = False
        self._start(gen, start_k)

    def _start(self, gen: int, k: int) -> None:
        self._gen = gen
        self._k = k                 # next micro-batch to consume
        self._start_k = k
        self._req = k               # next micro-batch to request
        self._end: Optional[int] = None
        self._inflight: Deque[Tuple[int, Any]] = collections.deque()
        self._tokens = self._padding = 0
        self._mom_sum = self._molb_sum = 0.0
        self._folded = 0
        self._t0: Optional[float] = None
        self._t1: Optional[float] = None
        #: seconds spent waiting in each ``next`` (for benchmarks)
        self.wait_times = []

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        batch = self.next_batch()
        if batch is None:
            raise StopIteration
        return batch

    def next_batch(self, rank: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """The next micro-batch dict of this client's rank, or None after
        ``train_steps``.  Blocks until it is built."""
        if rank is not None and int(rank) != self.rank:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"rank {rank} is not served by this client (rank {self.rank})")
        self._check_open()
        t = time.perf_counter()
        if self._t0 is None:
            self._t0 = t
        while len(self._inflight) < self._prefetch + 1 and (self._end is None or self._req < self._end):
            ref = self._ctor.next.remote(self.rank, self._req, self._gen, self._k)
            self._inflight.append((self._req, ref))
            self._req += 1
        if not self._inflight:
            return None
        k, ref = self._inflight.popleft()
        try:
            res = _get(ref)
        except BaseException:
            self._drain()
            raise
        if res is None:
            self._end = k
            self._inflight.clear()
            self._req = k
            self._t1 = time.perf_counter()
            return None
        obj, meta = res
        data = _get(obj)
        self._k = k + 1
        self._t1 = time.perf_counter()
        self.wait_times.append(self._t1 - t)
        self._tokens += meta["tokens"]
        self._padding += meta["padding"]
        if meta["micro_batch"] == self._nmb - 1 and meta["step_stats"]:
            self._mom_sum += meta["step_stats"]["max_over_mean"]
            self._molb_sum += meta["step_stats"]["max_over_lower_bound"]
            self._folded += 1
        return self._to_dict(data)

    def _drain(self) -> None:
        """Collect the requests in flight after an error (so Ray does not report their
        errors as unhandled) and forget them."""
        for _, ref in self._inflight:
            try:
                ray.get(ref, timeout=2.0)
            except Exception:  # noqa: BLE001 - the first error was raised already
                pass
        self._inflight.clear()
        self._req = self._k

    def _to_dict(self, data: Dict[str, Any]) -> Dict[str, Any]:
        torch = self._torch
        out: Dict[str, Any] = {}
        for name in _ARRAY_FIELDS:
            value = data.get(name)
            if value is None:
                continue
            if torch is not None:
                with warnings.catch_warnings():  # read-only object store memory, shared
                    warnings.simplefilter("ignore", UserWarning)
                    value = torch.from_numpy(value)
                if self._pin:
                    value = value.pin_memory()
            out[name] = value
        if "max_seqlen" in data:
            out["max_seqlen"] = int(data["max_seqlen"])
        return out

    # ---------------------------------------------------------------------- state

    def state_dict(self) -> Dict[str, Any]:
        """``{"version": 1, "blob": bytes}``: the position after the micro-batches this
        rank consumed (not the prefetched ones); the embedded loader's blob, byte for
        byte, so either can restore the other."""
        self._check_open()
        blob = _get(self._ctor.state.remote(self._k, self._gen))
        return {"version": polyload.STATE_VERSION, "blob": blob}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly from ``state``: restarts the whole deployment (planner and
        constructors) from it, once for all ranks loading the same state; drops
        prefetched batches.

        Raises:
            StateError: as :meth:`polyload.Loader.load_state_dict`.
            ValueError: an unknown ``version``.
        """
        self._check_open()
        blob = polyload._state_blob(state)
        gen, k = _get(self._planner.restart.remote(blob, False))
        _get(self._ctor.sync.remote(gen))
        self._start(gen, k)

    # ---------------------------------------------------------------------- stats

    def stats(self) -> Dict[str, Any]:
        """The run summary so far, with the fields of :meth:`polyload.Loader.stats`."""
        self._check_open()
        blob = _get(self._ctor.state.remote(self._k, self._gen))
        src = blob_sources(blob)
        secs = (self._t1 - self._t0) if self._t0 is not None and self._t1 is not None else 0.0
        all_tokens = self._tokens + self._padding
        drawn_all = sum(s["drawn"] for s in src.values())
        target_all = sum(s["target"] for s in src.values())
        return {
            "steps": max(0, self._k // self._nmb - self._start_k // self._nmb),
            "tokens": self._tokens,
            "padding_fraction": self._padding / all_tokens if all_tokens else 0.0,
            "tokens_per_s": self._tokens / secs if secs > 0 else 0.0,
            "seconds": secs,
            "skipped": sum(s["skipped"] for s in src.values()),
            "imbalance": {
                "max_over_mean": self._mom_sum / self._folded if self._folded and self._mom_sum > 0 else None,
                "max_over_lower_bound": (self._molb_sum / self._folded
                                         if self._folded and self._molb_sum > 0 else None),
            },
            "sources": {
                name: {
                    "documents": s["documents"],
                    "tokens": s["drawn"],
                    "epochs_completed": s["epoch"],
                    "realized_fraction": s["drawn"] / drawn_all if drawn_all > 0 else 0.0,
                    "scheduled_fraction": s["target"] / target_all if target_all > 0 else 0.0,
                }
                for name, s in src.items()
            },
        }

    # -------------------------------------------------------------------- closing

    def _check_open(self) -> None:
        if self._closed:
            raise polyload.PolyloadError(_core.ECLOSED, "ECLOSED", "client is closed")

    def close(self) -> None:
        """Drop the requests in flight (collected, so Ray reports none of them as an
        unhandled error); the deployment keeps running.  Idempotent."""
        if not self._closed:
            self._drain()
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("polyload.ray.Client is not picklable: create one per trainer process")

    def __repr__(self) -> str:
        return f"<polyload.ray.Client rank={self.rank} {'closed' if self._closed else 'open'}>"
