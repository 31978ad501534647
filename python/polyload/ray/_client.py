"""``Client``: a trainer rank's view of a deployment, with the interface of
``polyload.Loader``.

A Client *is* an embedded loader in external mode (``pl_loader`` with
``external = 1``): the same worker threads build the micro-batches, the same C code keeps
the consumed position, the state blob and the statistics.  Only where the steps come
from differs: a transport thread asks the C loader which steps it takes next
(``want_steps``: a burst of them, up to the client's prefetch past the step being
built), fetches those steps' packages for this rank's DP rank from the rank's data
constructor (Ray tasks whose results this process owns) and pushes them
(``push_package``).  So batches, ``state_dict()`` and ``stats()`` equal the embedded
loader's by construction.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

import ray

import polyload
from polyload import _core
from polyload._config import _make_config
from polyload.loader import _state_blob

from . import _registry
from ._calls import actor_lost, get, unwrap
from ._config import sources_digest
from ._failure import set_failure_detection_env
from ._protocol import PROTOCOL, StoodDown, unpack_fetch


_get = get  # ray.get with polyload's exceptions and a deadline

#: the most seconds the deployment's view of a trainer's finished steps may lag behind
#: (``DataConstructor.at``, or a fetch that carries them); at most one report per interval
AT_INTERVAL_S = 0.25

#: The most steps whose micro-batches a Client's C loader expands ahead by default
#: (``prefetch_batches``): a fetch may carry more steps (``fetch_steps``, up to 256), and
#: those beyond stay compact packages (~2.5 bytes a token against ~40 expanded).
EXPAND_STEPS = 32

#: Steps the first fetch of a Client asks for, and again the first after a move to
#: another constructor: a call returns once all of its steps are built, so the first
#: batch waits for these only.  Later calls double in size up to ``prefetch`` steps and
#: to about ``CALL_S`` seconds of the rank's recent consumption, so that a slow trainer
#: or deployment makes small calls (each step of a call may take ``timeout``).
FIRST_FETCH_STEPS = 4
CALL_S = 1.0


def _check_reachable(address: str, timeout: float) -> None:
    """A ``host:port`` Ray address that accepts no TCP connection within ``timeout`` is
    PolyloadIOError now (Ray's own client would retry for half a minute and then end
    the process).  Other forms (``auto``, ``local``, ``ray://``) are left to Ray."""
    import socket  # noqa: PLC0415

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise polyload.PolyloadIOError(
            _core.EIO, "EIO",
            f"polyload.ray.Client: no Ray cluster reachable at {address} within "
            f"{timeout:g} s ({e})") from None


def _collect(refs: List[Any], timeout: float) -> List[Any]:
    """Take the results of the calls among ``refs`` that are done within ``timeout``
    (errors included: Ray reports a result never taken as unhandled); the others."""
    if not refs:
        return []
    done, rest = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for r in done:
        try:
            ray.get(r, timeout=0)
        except Exception:  # noqa: BLE001 - a failed call of a constructor moved from
            pass
    return rest


class _StepError:
    """A step that failed after the steps of a fetch before it (``DataConstructor.fetch``'s
    ``error``): reported to the trainer at that step."""

    __slots__ = ("code", "message")

    def __init__(self, code: int, message: str) -> None:
        self.code, self.message = int(code), str(message)


class _Stalled(Exception):
    """A constructor that answers nothing (a stopped or hung process): moved away from
    as from a lost one."""


def _moves_on(e: BaseException) -> bool:
    """Whether a failed call to a constructor moves the client to the group's next
    one: its process is lost, it stalled, or it stood down (another one serves)."""
    exc = unwrap(e)
    return actor_lost(exc) or isinstance(exc, (_Stalled, StoodDown))


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
        prefetch: the most steps fetched per call to the constructor (two calls are in
            flight, so up to ``2 * prefetch`` steps arrive ahead of the one being
            consumed; the constructor itself builds ``prefetch_steps`` ahead).  Calls
            start at ``FIRST_FETCH_STEPS`` (4), double per call, and carry about
            ``CALL_S`` (1 s) of the rank's recent consumption at most, so a first batch
            or a slow rank never waits for hundreds of steps.  Default: the
            deployment's ``fetch_steps`` (half its ``prefetch_steps``).  These arrive as
            packages (tokens at their stored width, ~2.5 bytes a token).
        prefetch_batches: micro-batches the rank's C loader expands ahead of the one
            being consumed (the embedded Loader's ``prefetch``): each is a micro-batch
            of the SPEC section 3 fields, ~40 bytes a token slot, so this bounds the
            client's memory (the packages beyond it stay compact).  Default: the
            micro-batches of ``prefetch`` steps (one fetch), at most ``EXPAND_STEPS``
            (32) steps' worth, deep enough that the trainer does not wait on the
            transport thread; e.g. the config's ``prefetch`` to hold a few micro-batches
            only.
        threads: worker threads that expand packages into micro-batches (default 1).
        timeout: seconds any single wait on the deployment may take before it is an
            error naming the actor (PolyloadTimeoutError).
        address: Ray address for ``ray.init`` when Ray is not initialized in this
            process (default: ``$RAY_ADDRESS`` or ``"auto"``); the client then sets
            ``FAILURE_DETECTION_ENV`` first (:func:`polyload.ray.set_failure_detection_env`).
            A trainer that calls ``ray.init`` itself calls that function before it.
        stall_timeout: a fetch that takes longer than this many seconds asks the
            constructor for a sign of life; one that gives none within as long again
            (a stopped or hung process) counts as lost, and the fetches move to the
            group's next constructor (a standby).  Default: the deployment's
            ``read_timeout``.

    A client started again for a rank the deployment served before (its trainer's
    process died) continues at the first micro-batch of the step that rank had not
    finished (it finished a step when it asked for the next step's first micro-batch);
    what it had of that step is delivered again, since the dead process's partial
    gradient went with it.  (That report goes to the constructor without waiting for
    an answer, the latest one at most once per ``AT_INTERVAL_S`` (250 ms), or with
    a fetch: from a
    process killed within that time of asking, or before Ray sent the report, the
    successor starts one or a few steps earlier: steps again, never one skipped.)

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
                 address: Optional[str] = None,
                 stall_timeout: Optional[float] = None,
                 prefetch_batches: Optional[int] = None) -> None:
        self._thread: Optional[threading.Thread] = None
        self._loader = None
        cfg = _make_config(config)
        if not ray.is_initialized():
            addr = address or os.environ.get("RAY_ADDRESS", "auto")
            _check_reachable(addr, min(float(timeout), 10.0))
            set_failure_detection_env()  # read by Ray when it starts in this process
            ray.init(address=addr, namespace=namespace, include_dashboard=False,
                     log_to_driver=False)
        planner = ray.get_actor(_registry.planner(name), namespace=namespace)
        # The layout without per-source lists (source names as a digest): kept for the
        # client's life, in every trainer process.
        info = _get(planner.info.remote(True), timeout)
        if info.get("protocol") != PROTOCOL:
            by = (f"polyload {info['polyload_version']}" if "polyload_version" in info
                  else "an older polyload")
            raise polyload.ConfigError(
                _core.ECONFIG, "ECONFIG",
                f"polyload.ray.Client: deployment {namespace}/{name} was launched by {by}"
                f" (protocol {info.get('protocol', 1)}); this Client is polyload "
                f"{polyload.__version__} (protocol {PROTOCOL}): launch the deployment with "
                f"the trainers' polyload")
        names = [cfg.source_name(i) for i in range(cfg.num_sources)]
        nmb = cfg.get_int("micro_batches_per_rank")
        world = cfg.world_size()
        if (info.get("fingerprint") != cfg.fingerprint() or info.get("world_size") != world
                or info.get("sources_sha256") != sources_digest(names)
                or info.get("micro_batches_per_rank") != nmb
                or info.get("dp") != cfg.get_int("topology.dp")):
            info = _get(planner.info.remote(), timeout)  # the names, for the message
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
        if prefetch_batches is not None and int(prefetch_batches) < 1:
            raise ValueError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
        # The embedded Loader's set-up (rank, topology checks, torch), over an external
        # C loader holding only this rank; it expands `prefetch_batches` micro-batches
        # ahead (default: the steps of one fetch), the packages beyond stay compact.
        super().__init__(cfg, rank=rank, pin_memory=pin_memory, threads=threads,
                         prefetch=int(prefetch_batches) if prefetch_batches
                         else nmb * min(EXPAND_STEPS, max(1, int(prefetch))),
                         _external=True)
        self.info = info
        self._nmb = nmb
        self._planner = planner
        self._timeout = float(timeout)
        self._prefetch = max(1, int(prefetch))
        self._call_cap = self._prefetch  # steps a call may carry at the recent rate
        self._stall_timeout = float(stall_timeout if stall_timeout is not None
                                    else info.get("read_timeout", 30.0))
        dp_rank = self.rank_info["dp_rank"]
        g = next(i for i, grp in enumerate(info["dp_groups"]) if dp_rank in grp)
        # the group's constructor, then its warm standbys (``constructor_shadows``):
        # fetches go to one; when its process is lost they move to the next at once
        self._ctor_names = [info["constructors"][g]] + \
            list((info.get("constructor_shadows") or [[]] * (g + 1))[g])
        self._ctors = [ray.get_actor(n, namespace=namespace) for n in self._ctor_names]
        self._ci = 0
        # Connect to the standbys now (Ray opens a connection at an actor's first call),
        # so that a move to one costs no connection set-up.
        try:
            ray.wait([c.pid.remote() for c in self._ctors[1:]],
                     num_returns=len(self._ctors) - 1, timeout=min(10.0, self._timeout))
        except Exception:  # noqa: BLE001 - a standby restarting: connected at its first use
            pass
        gen, z = _get(planner.current.remote(True), timeout)  # packed: ~2 KB, not ~40
        blob = _core.state_unpack(z)
        # A rank served before (its trainer's process died and came back): continue at
        # the first step it had not finished.
        step = self._rejoin(gen)
        if step > _core.state_info(blob)["step"]:
            blob = _core.state_unpack(_get(planner.state.remote(gen, step), timeout))
        self._start(gen, blob)

    def _await(self, ref):
        """``ray.get(ref)`` within ``timeout``; when the call takes more than
        ``stall_timeout``, the constructor is asked for its pid: one that does not answer
        within ``stall_timeout`` either counts as lost (_Stalled) when the group has a
        standby to move to."""
        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            ready, _ = ray.wait([ref], timeout=max(0.0, min(left, self._stall_timeout)))
            if ready or left <= self._stall_timeout or len(self._ctors) < 2:
                return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            ping = self._ctor.pid.remote()
            answered, _ = ray.wait([ping], timeout=self._stall_timeout)
            if not answered:
                raise _Stalled(f"constructor {self._ctor_name} answered neither a fetch nor "
                               f"a ping within stall_timeout={self._stall_timeout:g} s")

    def _next_ctor(self, e: BaseException) -> int:
        """The constructor to move to after call error ``e``: the one that took over
        when a stood-down one names it, else the group's next."""
        serving = getattr(unwrap(e), "serving", None)
        if isinstance(unwrap(e), StoodDown) and serving in self._ctor_names \
                and serving != self._ctor_name:
            return self._ctor_names.index(serving)
        return (self._ci + 1) % len(self._ctors)

    def _rejoin(self, gen: int) -> int:
        """The step this rank continues at (``DataConstructor.rejoin``), from the
        constructor of the group that serves it (a standby that took over, when the
        primary was lost); when none serves, the first that answers takes over."""
        deadline = time.monotonic() + self._timeout
        tried = 0
        while True:
            try:
                # one round asks only a serving one; then the first that answers serves
                got = _get(self._ctor.rejoin.remote(gen, self.rank, tried >= len(self._ctors)),
                           self._timeout)
            except Exception as e:  # noqa: BLE001 - lost: the next one of the group
                if not _moves_on(e) or time.monotonic() > deadline:
                    raise
                got = None
                time.sleep(0.05)
            if got is not None:
                g, step = got
                return step if g == gen else -1
            tried += 1
            self._ci = (self._ci + 1) % len(self._ctors)

    # ------------------------------------------------------------ transport

    @property
    def _ctor(self):
        """The constructor this client fetches from now."""
        return self._ctors[self._ci]

    @property
    def _ctor_name(self) -> str:
        return self._ctor_names[self._ci]

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
        #: times this client moved to another constructor of its group (a standby)
        self.switches = getattr(self, "switches", 0)
        #: each move: {"time", "from", "to", "step" (first step asked again), "reason"}
        self.moves: List[Dict[str, Any]] = getattr(self, "moves", [])
        #: seconds next_batch blocked (this trainer's data wait), reported with fetches
        self.data_wait_s = getattr(self, "data_wait_s", 0.0)
        self._waits_counted = getattr(self, "_waits_counted", False)
        self._reported = _core.state_info(blob)["step"]
        # the latest finished step sent by a fetch or by _report_at
        self._at_sent = self._reported
        self._at_carried_t = -float("inf")  # when a fetch last carried a new one
        self._held: Dict[int, Any] = {}  # packages received, not pushed yet
        self._inflight: Deque[Tuple[int, int, Any]] = collections.deque()
        self._thread = threading.Thread(target=self._transport, args=(gen, self._stop_event),
                                         name=f"polyload-client-{self.rank}", daemon=True)
        self._thread.start()
        # Steps the trainer finished go to the constructor (DataConstructor.at) from a
        # thread of their own: submitting an actor call on the trainer's thread took
        # 0.3-7 ms of its step (bench/ray/ray_autoscale.py), inside its data wait.
        self._at_wake = threading.Event()
        self._at_stop = threading.Event()
        self._at_thread = threading.Thread(target=self._report_at,
                                           args=(gen, self._at_wake, self._at_stop),
                                           name=f"polyload-client-at-{self.rank}", daemon=True)
        self._at_thread.start()

    def _report_at(self, gen: int, wake: threading.Event, stop: threading.Event) -> None:
        """Send the trainer's latest finished step (``_reported``, set by next_batch,
        which then sets ``wake``) to the serving constructor, at most one call per
        ``AT_INTERVAL_S``; no answer is awaited (a lost constructor learns the steps
        from the next fetches).  A call per step cost the trainer's process and the
        constructor ~1 ms of CPU each, and a wake-up of this thread per step cost the
        trainer's thread the GIL: at 100+ steps/s per rank (bench/ray/ray_pipeline.py)
        they took two thirds of the deployment's tokens/s.  A trainer whose steps take
        longer than the interval has each one reported at once; a faster one late by
        under the interval, so that a client started again after its process died is
        served at most the steps of that interval again (never one less).  ``stop``
        flushes what is pending and ends the thread.  Fetches carry the latest
        finished step too (``fetch(at=...)``): the interval counts from the later of
        this thread's last call and the last fetch that carried a new step, so a
        trainer that fetches more often than the interval needs no call of its own
        (each costs ~1.5 ms of CPU over the processes involved on a 2-core machine)."""
        last = -float("inf")
        own = self._reported  # the latest step this thread sent itself
        while True:
            wake.wait()
            wake.clear()
            while not stop.is_set():  # steps finished meanwhile go in one call after it
                left = max(last, self._at_carried_t) + AT_INTERVAL_S - time.monotonic()
                if left <= 0:
                    break
                stop.wait(left)
            step = self._reported
            # A fetch "carries" a step once submitted; the constructor may still refuse
            # it (a stood-down standby, a call abandoned in a take-over) and the retry
            # that would carry it again does not happen after close(): the flush at
            # close sends whatever this thread has not sent itself.
            if step > (own if stop.is_set() else self._at_sent):
                try:
                    self._ctor.at.remote(gen, self.rank, step)
                except Exception:  # noqa: BLE001 - a lost constructor: fetches handle it
                    pass
                own = step
                self._at_sent = max(self._at_sent, step)
                last = time.monotonic()
            if stop.is_set():
                return

    def next_batch(self, rank: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """As :meth:`polyload.Loader.next_batch`; the time it blocks is this trainer's
        data wait (``data_wait_s``, seconds since the client started), which the next
        fetch reports to the constructor for the autoscaler (the first batch's wait,
        the deployment's start-up, is left out)."""
        if self._loader is not None:
            step, mb, _ = self._loader.position()
            if mb == 0 and step > self._reported:
                # Asking for a step's first micro-batch: the trainer finished the steps
                # before it (their optimizer step is done).  A client started again for
                # this rank continues there (DataConstructor.rejoin).
                self._reported = step
                if not self._at_wake.is_set():
                    self._at_wake.set()
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
        at_thread = getattr(self, "_at_thread", None)
        if at_thread is not None:
            self._at_stop.set()
            self._at_wake.set()
            at_thread.join(timeout=self._timeout)
            self._at_thread = None
        self._stop_event.set()
        if self._loader is not None:
            self._loader.stop()
        t.join(timeout=self._timeout)  # a thread still in ray.get checks its event first

    def _transport(self, gen: int, stop: threading.Event) -> None:
        """Fetch the packages the C loader asks for: ``prefetch`` steps per call, two
        calls in flight; push them in bursts.  The loader grants up to ``prefetch``
        steps past the one it builds next and asks again once half of them are built
        (``want_steps``), so this thread wakes (and takes the GIL from the trainer) once
        per ``prefetch / 2`` steps instead of once per step."""
        loader, rank = self._loader, self.rank
        ahead = self._prefetch
        low = ahead // 2
        granted: Deque[int] = collections.deque()  # steps to push, in order
        inflight, ready = self._inflight, self._held  # (prefetched() reads them)
        lost_in_row = 0  # constructors found lost since the last package
        abandoned: List[Any] = []  # calls to a constructor moved away from
        lost_since: Optional[float] = None
        train_steps = self.config.get_int("train_steps")
        next_req: Optional[int] = None
        size = FIRST_FETCH_STEPS  # steps the next call may ask for (doubles per call)
        t_rate, n_rate = time.monotonic(), 0  # steps pushed since t_rate: the rate
        try:
            while not stop.is_set():
                if not granted:
                    got = loader.want_steps(-1, ahead, low)
                    if got == "done" or got is None:
                        return
                    granted.extend(range(got[0], got[0] + got[1]))
                want = granted.popleft()
                if next_req is None:
                    next_req = want
                while want not in ready:
                    while len(inflight) < 2 and (train_steps < 0 or next_req <= train_steps):
                        n = self._prefetch if train_steps < 0 else min(
                            self._prefetch, train_steps - next_req + 1)
                        now = time.monotonic()
                        if now - t_rate >= 2 * CALL_S and n_rate:  # the recent rate
                            rate = n_rate / (now - t_rate)
                            t_rate, n_rate = now, 0
                            self._call_cap = max(FIRST_FETCH_STEPS, int(rate * CALL_S))
                        n = min(n, size, self._call_cap)
                        size = min(2 * size, max(1, self._prefetch))
                        have = inflight[0][0] if inflight else next_req
                        at = self._reported
                        ref = self._ctor.fetch.remote(gen, rank, next_req, n, self._timeout,
                                                      loader.position()[0], have,
                                                      self.data_wait_s, self.switches, at)
                        if at > self._at_sent:
                            self._at_sent = at
                            self._at_carried_t = time.monotonic()
                        inflight.append((next_req, n, ref))
                        next_req += n
                    if not inflight:
                        loader.fail_step(want, _core.ESTATE,
                                         f"polyload.ray.Client rank {rank}: step {want} is past "
                                         f"the end of the deployment's steps")
                        return
                    first, n, ref = inflight.popleft()
                    if abandoned:
                        abandoned = _collect(abandoned, 0.0)
                    try:
                        pkgs = self._await(ref)
                        lost_since = None
                        lost_in_row = 0
                    except Exception as e:  # noqa: BLE001 - sorted out below
                        if not _moves_on(e):
                            err = e
                        else:
                            # The constructor's process is gone: the next one of the
                            # group (a warm standby; Ray restarts the lost one) takes
                            # over from the least step its ranks had not received; ask
                            # again for what this rank has not (fetch's `have`).
                            now = time.monotonic()
                            lost_since = lost_since or now
                            if now - lost_since < self._timeout and not stop.is_set():
                                # those calls failed too, or will (collected later, so
                                # that Ray reports none of them as unhandled)
                                abandoned += [r for _, _, r in inflight]
                                inflight.clear()
                                next_req = first
                                size = FIRST_FETCH_STEPS  # the new one starts small
                                self.retries += 1
                                lost_in_row += 1
                                if len(self._ctors) > 1:
                                    was = self._ctor_name
                                    self._ci = self._next_ctor(e)
                                    self.switches += 1
                                    self.moves.append({"time": time.time(), "from": was,
                                                       "to": self._ctor_name, "step": first,
                                                       "reason": type(unwrap(e)).__name__})
                                if lost_in_row % len(self._ctors) == 0:
                                    time.sleep(0.05)  # every one is restarting
                                continue
                            err = polyload.PolyloadError(
                                _core.EIO, "EIO",
                                f"polyload.ray.Client rank {rank}: constructors "
                                f"{', '.join(self._ctor_names)} lost and not back within "
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
                    # DataConstructor.fetch: (packages, ends, final[, error])
                    packages, final, step_error = unpack_fetch(pkgs)
                    for k, p in enumerate(packages):
                        ready[first + k] = p
                    if final is not None:
                        ready[first + len(packages)] = final
                    elif step_error is not None:  # that step failed: its error, there
                        ready[first + len(packages)] = _StepError(*step_error)
                pkg = ready.pop(want)
                if stop.is_set():
                    return
                if isinstance(pkg, _StepError):
                    loader.fail_step(want, pkg.code, pkg.message)
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
                n_rate += 1
                self.package_bytes += len(pkg)
                del pkg
        except polyload.PolyloadError:
            return  # stopped (ECLOSED), or the loader failed: next() reports it
        except Exception as e:  # noqa: BLE001 - anything else reaches next(), never a hang
            if not stop.is_set():
                try:
                    loader.fail_step(loader.position()[0], _core.EIO,
                                     f"polyload.ray.Client rank {rank}: transport from "
                                     f"{self._ctor_name}: {type(e).__name__}: {e}")
                except polyload.PolyloadError:
                    pass
        finally:  # collect, so Ray reports none as unhandled
            live = [r for _, _, r in inflight]
            if not stop.is_set():  # left after an error: nobody will take them
                for r in live:
                    try:
                        ray.cancel(r)
                    except Exception:  # noqa: BLE001 - done or its actor gone
                        pass
            _collect(live, 2.0)
            _collect(abandoned, 0.0)

    def prefetched(self) -> Dict[str, int]:
        """What this client holds ahead of its trainer, now: ``pushed`` (steps handed to
        the C loader since the client started, ``packages``; the loader expands them
        up to ``prefetch_batches`` ahead), ``held`` (packages received, waiting for the
        loader's window), ``calls`` (fetches in flight) and ``calls_done`` (of those,
        the ones whose packages have arrived in this node's object store).  A snapshot
        for monitoring (and for measuring memory at a steady state); thread-safe."""
        refs = [r for _, _, r in list(self._inflight)]
        done = len(ray.wait(refs, num_returns=len(refs), timeout=0,
                            fetch_local=False)[0]) if refs else 0
        return {"pushed": int(self.packages), "held": len(self._held), "calls": len(refs),
                "calls_done": done}

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
        blob = _state_blob(state)
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
