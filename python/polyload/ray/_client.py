"""``Client``: a trainer rank's view of a deployment, with the interface of
``polyload.Loader``.

A Client *is* an embedded loader in external mode (``pl_loader`` with
``external = 1``): the same worker threads build the micro-batches, the same C code keeps
the consumed position, the state blob and the statistics.  Only where the steps come
from differs: a transport thread asks the C loader which step it needs next
(``want_step``), fetches that step's package for this rank's DP rank from the rank's
data constructor (a Ray task whose result this process owns) and pushes it
(``push_package``).  So batches, ``state_dict()`` and ``stats()`` equal the embedded
loader's by construction.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Deque, Dict, Mapping, Optional, Tuple

import ray

import polyload
from polyload import _core

from ._common import actor_lost, get, unwrap


_get = get  # ray.get with polyload's exceptions and a deadline


class Client(polyload.Loader):
    """The micro-batches of one global rank from a running deployment (:func:`launch`).

    A drop-in for :class:`polyload.Loader`: iteration yields one dict per micro-batch
    (SPEC section 3; torch tensors, or NumPy arrays without torch), ending after
    ``train_steps``; ``state_dict``/``load_state_dict``, ``stats``, ``close`` and the
    context manager behave as the Loader's (they are the Loader's, over a C loader fed
    by the deployment).  The batches are bit for bit the embedded loader's for the same
    config, whatever the numbers of actors.

    Args:
        config: the deployment's config (a YAML path or a dict); checked against the
            deployment's layout.  Parsing it touches no data file, so a trainer node
            needs no copy of the data.
        rank: the global rank.  Default: ``torch.distributed.get_rank()`` when
            initialized, else ``$RANK``, else 0.
        namespace, name: where :func:`launch` registered the actors.
        pin_memory: as the Loader's.
        prefetch: steps fetched per call to the constructor (two calls are in flight,
            so up to ``2 * prefetch`` steps arrive ahead of the one being consumed; the
            constructor itself builds ``prefetch_steps`` ahead).  Default: the
            deployment's ``fetch_steps`` (half its ``prefetch_steps``).
        threads: worker threads that expand packages into micro-batches (default 1).
        timeout: seconds any single wait on the deployment may take before it is an
            error naming the actor (PolyloadTimeoutError).
        address: Ray address for ``ray.init`` when Ray is not initialized in this
            process (default: ``$RAY_ADDRESS`` or ``"auto"``).

    Raises:
        ConfigError: the config does not match the deployment.
        RangeError: ``rank`` is outside the topology.
        FormatError, PolyloadIOError, ...: errors of the actors, as the embedded loader
            raises them (unwrapped from Ray's ``RayTaskError``).
        LagError: this rank fell more than ``max_lag_steps`` behind its group.
        ValueError: no deployment named ``name`` in ``namespace``.
    """

    def __init__(self, config, rank: Optional[int] = None, namespace: str = "polyload", *,
                 name: str = "polyload", pin_memory: bool = False, prefetch: Optional[int] = None,
                 threads: int = 1, timeout: float = 600.0,
                 address: Optional[str] = None) -> None:
        self._thread: Optional[threading.Thread] = None
        self._loader = None
        cfg = polyload._make_config(config)
        if not ray.is_initialized():
            ray.init(address=address or os.environ.get("RAY_ADDRESS", "auto"),
                     namespace=namespace, include_dashboard=False, log_to_driver=False)
        planner = ray.get_actor(f"{name}.planner", namespace=namespace)
        info = _get(planner.info.remote(), timeout)
        names = [cfg.source_name(i) for i in range(cfg.num_sources)]
        nmb = cfg.get_int("micro_batches_per_rank")
        world = cfg.world_size()
        if (info.get("fingerprint") != cfg.fingerprint() or info.get("world_size") != world
                or info.get("sources") != names or info.get("micro_batches_per_rank") != nmb
                or info.get("dp") != cfg.get_int("topology.dp")):
            raise polyload.ConfigError(
                _core.ECONFIG, "ECONFIG",
                f"polyload.ray.Client: the config does not match deployment {namespace}/{name} "
                f"(a setting that decides the batches differs: world size {world} vs "
                f"{info.get('world_size')}, sources {names} vs {info.get('sources')}, "
                f"micro-batches per rank {nmb} vs {info.get('micro_batches_per_rank')}, "
                f"config fingerprint {cfg.fingerprint():#x} vs {info.get('fingerprint', 0):#x}; "
                f"only threads and prefetch may differ)")
        if prefetch is None:
            prefetch = int(info.get("fetch_steps", 4))
        # The embedded Loader's set-up (rank, topology checks, torch), over an external
        # C loader holding only this rank.
        super().__init__(cfg, rank=rank, pin_memory=pin_memory, threads=threads,
                         prefetch=nmb * max(1, int(prefetch)), _external=True)
        self.info = info
        self._nmb = nmb
        self._planner = planner
        self._timeout = float(timeout)
        self._prefetch = max(1, int(prefetch))
        dp_rank = self.rank_info["dp_rank"]
        g = next(i for i, grp in enumerate(info["dp_groups"]) if dp_rank in grp)
        self._ctor_name = info["constructors"][g]
        self._ctor = ray.get_actor(self._ctor_name, namespace=namespace)
        gen, blob = _get(planner.current.remote(), timeout)
        self._start(gen, blob)

    # ------------------------------------------------------------ transport

    def _start(self, gen: int, blob: bytes) -> None:
        """Stand at ``blob`` (generation ``gen``) and start the transport thread."""
        self._gen = gen
        self._handle().set_state(blob)
        self._t0 = self._t1 = None
        self._stop_event = threading.Event()  # one per thread: a late old one stays stopped
        #: packages fetched and their bytes (what crossed the object store to this rank)
        self.packages = getattr(self, "packages", 0)
        self.package_bytes = getattr(self, "package_bytes", 0)
        #: fetches asked again after their constructor was lost
        self.retries = getattr(self, "retries", 0)
        #: seconds next_batch blocked (this trainer's data wait), reported with fetches
        self.data_wait_s = getattr(self, "data_wait_s", 0.0)
        self._waits_counted = getattr(self, "_waits_counted", False)
        self._thread = threading.Thread(target=self._transport, args=(gen, self._stop_event),
                                         name=f"polyload-client-{self.rank}", daemon=True)
        self._thread.start()

    def next_batch(self, rank: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """As :meth:`polyload.Loader.next_batch`; the time it blocks is this trainer's
        data wait (``data_wait_s``, seconds since the client started), which the next
        fetch reports to the constructor for the autoscaler (the first batch's wait,
        the deployment's start-up, is left out)."""
        t0 = time.perf_counter()
        b = super().next_batch(rank)
        if self._waits_counted:
            self.data_wait_s += time.perf_counter() - t0
        self._waits_counted = True
        return b

    def _halt(self) -> None:
        """Stop the transport thread (wakes its waits in C)."""
        t, self._thread = self._thread, None
        if t is None:
            return
        self._stop_event.set()
        if self._loader is not None:
            self._loader.stop()
        t.join(timeout=self._timeout)  # a thread still in ray.get checks its event first

    def _transport(self, gen: int, stop: threading.Event) -> None:
        """Fetch the packages the C loader asks for: ``prefetch`` steps per call, two
        calls in flight; push each when the loader wants it."""
        loader, ctor, rank = self._loader, self._ctor, self.rank
        inflight: Deque[Tuple[int, int, Any]] = collections.deque()
        lost_since: Optional[float] = None
        ready: Dict[int, Any] = {}
        train_steps = self.config.get_int("train_steps")
        next_req: Optional[int] = None
        try:
            while not stop.is_set():
                want = loader.want_step(-1)
                if want == "done" or want is None:
                    return
                if next_req is None:
                    next_req = want
                while want not in ready:
                    while len(inflight) < 2 and (train_steps < 0 or next_req <= train_steps):
                        n = self._prefetch if train_steps < 0 else min(
                            self._prefetch, train_steps - next_req + 1)
                        have = inflight[0][0] if inflight else next_req
                        ref = ctor.fetch.remote(gen, rank, next_req, n, self._timeout,
                                                loader.position()[0], have, self.data_wait_s)
                        inflight.append((next_req, n, ref))
                        next_req += n
                    if not inflight:
                        loader.fail_step(want, _core.ESTATE,
                                         f"polyload.ray.Client rank {rank}: step {want} is past "
                                         f"the end of the deployment's steps")
                        return
                    first, n, ref = inflight.popleft()
                    try:
                        pkgs = ray.get(ref, timeout=self._timeout)
                        lost_since = None
                    except Exception as e:  # noqa: BLE001 - sorted out below
                        if not actor_lost(unwrap(e)):
                            err = e
                        else:
                            # The constructor's process is gone: Ray restarts it and it
                            # rebuilds from the least step its ranks stand at; ask again
                            # for what this rank has not received (fetch's `have`).
                            now = time.monotonic()
                            lost_since = lost_since or now
                            if now - lost_since < self._timeout and not stop.is_set():
                                inflight.clear()  # those calls failed too, or will
                                next_req = first
                                self.retries += 1
                                time.sleep(0.05)
                                continue
                            err = polyload.PolyloadError(
                                _core.EIO, "EIO",
                                f"polyload.ray.Client rank {rank}: constructor "
                                f"{self._ctor_name} lost and not back within "
                                f"{self._timeout:g} s ({type(unwrap(e)).__name__}: {e})")
                    else:
                        err = None
                    try:
                        if err is not None:
                            raise err
                    except ray.exceptions.GetTimeoutError:
                        loader.fail_step(want, _core.ETIMEDOUT,
                                         f"polyload.ray.Client rank {rank}: constructor "
                                         f"{self._ctor_name} gave no package for steps "
                                         f"{first}..{first + n - 1} within {self._timeout:g} s")
                        return
                    except Exception as e:  # noqa: BLE001 - reaches next() with its type
                        exc = unwrap(e)
                        if isinstance(exc, polyload.PolyloadError):
                            loader.fail_step(want, exc.code, exc.message)
                        else:
                            loader.fail_step(want, _core.EIO,
                                             f"polyload.ray.Client rank {rank}: constructor "
                                             f"{self._ctor_name}: {type(exc).__name__}: {exc}")
                        return
                    if stop.is_set():
                        return
                    for k, pkg in enumerate(pkgs):
                        ready[first + k] = pkg
                pkg = ready.pop(want)
                if stop.is_set():
                    return
                try:
                    loader.push_package(pkg)
                except polyload.PolyloadError as exc:  # a bad package: next() reports it
                    if stop.is_set() or exc.code == _core.ECLOSED:
                        return
                    loader.fail_step(want, exc.code,
                                     f"polyload.ray.Client rank {rank}: package of step {want} "
                                     f"from {self._ctor_name}: {exc.message}")
                    return
                self.packages += 1
                self.package_bytes += len(pkg)
                del pkg
        except polyload.PolyloadError:
            return  # stopped (ECLOSED), or the loader failed: next() reports it
        finally:
            for _, _, ref in inflight:  # collect, so Ray reports none as unhandled
                try:
                    ray.get(ref, timeout=2.0)
                except Exception:  # noqa: BLE001
                    pass

    # ---------------------------------------------------------------------- state

    def _attach_state(self) -> None:
        """Packages carry no state blob: give the C loader the blob of the step its
        position stands at, from the planner (which keeps them compressed), when it
        lacks it."""
        loader = self._handle()
        step, _mb, have = loader.position()
        if not have:
            z = _get(self._planner.state.remote(self._gen, step), self._timeout)
            loader.attach_state(_core.state_unpack(z))

    def _with_state(self, fn):
        # The position may move (next() on another thread) between attaching the blob
        # and reading the state: attach again.
        for attempt in range(8):
            self._attach_state()
            try:
                return fn()
            except polyload.StateError:
                if attempt == 7 or self._handle().position()[2]:
                    raise

    def state_dict(self) -> Dict[str, Any]:
        """As :meth:`polyload.Loader.state_dict` (the blob of the step's start comes
        from the planner the first time a step needs it)."""
        return self._with_state(super().state_dict)

    def stats(self) -> Dict[str, Any]:
        """As :meth:`polyload.Loader.stats`."""
        return self._with_state(super().stats)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly from ``state``: the deployment restarts from it once for
        all ranks loading the same state (a rank that loads it later joins while the
        deployment still holds that position); drops prefetched batches.

        Raises:
            StateError: as :meth:`polyload.Loader.load_state_dict`.
            ValueError: an unknown ``version``.
        """
        self._handle()
        blob = polyload._state_blob(state)
        step = _core.state_info(blob)["step"]
        gen, _ = _get(self._planner.restart.remote(blob, False), self._timeout)
        _, cursor = _get(self._ctor.sync.remote(gen, self.rank), self._timeout)
        if cursor > step:  # this rank already went past it in that generation
            gen, _ = _get(self._planner.restart.remote(blob, True), self._timeout)
            _get(self._ctor.sync.remote(gen, self.rank), self._timeout)
        self._halt()
        self._start(gen, blob)

    # -------------------------------------------------------------------- closing

    def close(self) -> None:
        """Stop fetching and free the C loader; the deployment keeps running.
        Idempotent."""
        self._halt()
        super().close()

    def __reduce__(self):
        raise TypeError("polyload.ray.Client is not picklable: create one per trainer process")

    def __repr__(self) -> str:
        return f"<polyload.ray.Client rank={self.rank} {'closed' if self.closed else 'open'}>"
