"""The source loader actor (``NAME.source_loader.J``, standbys ``.shadow.K``): payloads
of index-range partitions of sources.

``read`` answers token ranges at their stored width (``pl_source_read_raw``), or, when
the config has image-text sources, a reply (``pl_reply_encode``) that adds each read's
image, decoded and resized here.  ``lengths`` tokenizes raw text documents for the
planner (the tokens stay for the reads).  A loader holds no training progress, only
its partitions (kept in Ray's key-value store, since the autoscaler changes them), so
any replica can serve any key of its partitions; it measures its own cost
(``profile``), which the autoscaler reads.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import ray

import polyload
from polyload import _core

from . import _registry
from ._calls import node_id
from ._config import enter_cwd, make_config
from ._routing import KEY_SHIFT


class SourceLoader:
    """Payloads of index-range partitions of sources: ``shards`` is a list of
    ``(source index, first document, end document)``.  ``read(reads)`` takes an int64
    array ``[n, 4]`` of ``(source, index, offset, count)`` (rows of one source
    together) and returns one uint8 array per run of rows of one source: their tokens
    back to back at that source's stored width (with image-text sources in the config:
    one ``pl_reply_encode`` reply, see ``_read_reply``)."""

    def __init__(self, payload, cwd: str, shards: Sequence[Tuple[int, int, int]],
                 watch: Optional[str] = None) -> None:
        self._payload, self._cwd = payload, cwd
        self._shards = [tuple(int(x) for x in s) for s in shards]
        if watch:
            # Started by the autoscaler, detached so that it does not die with the
            # autoscaler's process (Ray kills the actors an actor owns with it): it
            # leaves by itself once its deployment's planner is gone for good.
            threading.Thread(target=self._watch, args=(watch,), daemon=True,
                             name="polyload-watch").start()
        self._sources: Dict[int, Any] = {}
        self._ready = False
        self._setup_lock = threading.Lock()  # reads run on two threads

    def _ensure_ready(self) -> None:
        """Set up on the first call after Ray restarted the actor (its process died)."""
        if not self._ready:
            with self._setup_lock:
                if not self._ready:
                    self.setup()

    def _watch(self, planner: str, every: float = 2.0) -> None:
        ctx = ray.get_runtime_context()
        namespace = ctx.namespace
        missing = 0
        while True:
            time.sleep(every)
            try:
                ray.get_actor(planner, namespace=namespace)
                missing = 0
            except ValueError:  # the name is gone: the deployment was shut down or lost
                missing += 1
                if missing >= 3:
                    ray.kill(ctx.current_actor, no_restart=True)
                    return
            except Exception:  # noqa: BLE001 - the GCS is busy: look again later
                pass

    def setup(self, fresh: bool = False, standby: bool = False) -> Dict[str, Any]:
        """Open the partitions' sources.  Also run by the first read after Ray
        restarted the actor (its process died): a loader holds no progress, only its
        partitions, which it keeps in Ray's internal KV store (the autoscaler changes
        them), so a restarted loader serves what it served before its death.
        ``fresh``: a new actor (launch, a scale-up): the partitions given win.
        ``standby``: a warm standby (shadow) that serves no read until its primary is
        lost: once its sources are open (and checked) it gives back their mapped index
        pages (``Source.release_pages``) and unloads their tokenizers
        (``Source.release_tokenizer``); the first reads after a take-over fault the
        pages in again from the page cache, and its first tokenization of a source
        loads that source's tokenizer again (tens of ms for a 2 MB tokenizer.json)."""
        self._standby = bool(standby)
        # Tokenizers run on this actor's threads (a lengths or read call tokenizes on
        # the calling thread; max_concurrency 2) and the deployment scales with
        # actors: Hugging Face tokenizers' own thread pool (rayon) would add threads
        # whose heaps keep ~7 MiB more per source
        # (docs/internals/decisions/0005-one-tokenizer-thread-per-file.md).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # ... and on a pool of threads, each tokenizer file always on the same one, as
        # many as the CPUs the actor asked Ray for (at least 1), so that the CPU it
        # uses is the CPU it requested: a tokenizer used from several threads keeps
        # ~5 MiB more heap per source.  fastokens' own pool is held to the same count.
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
        threads = max(1, int(round(cpus)))
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        _core.set_tokenize_threads(threads)
        enter_cwd(self._cwd)
        ctx = ray.get_runtime_context()
        self._kv_key = _registry.shards_key(ctx.namespace, ctx.get_actor_name())
        saved = None if fresh else _registry.kv_get(self._kv_key)
        if saved is not None:
            self._shards = [tuple(int(x) for x in t) for t in saved]
        cfg = make_config(self._payload)
        self._cfg = cfg
        self._srcs: List[Any] = [None] * cfg.num_sources
        # cost profile (the autoscaler's input): per source, wall seconds in calls,
        # rows, tokens, bytes; the process's CPU seconds are split by wall share
        self._prof_lock = threading.Lock()
        # [source, (busy_s, rows, tokens, bytes, calls, read_cpu_s, tokenized)], float64
        # (counts stay exact below 2**53); a row with calls == 0 is a source not served
        self._prof = np.zeros((cfg.num_sources, 7), dtype=np.float64)
        self._t_start = time.monotonic()
        self._cpu_start = time.process_time()
        self._busy = 0.0
        self._read_cpu = 0.0  # thread CPU seconds of reads so far
        self._set_shards(self._shards)
        # Image-text sources in the config: reads are answered as C replies (below).
        self._images = cfg.get_int("image_sources") > 0
        self._ready = True
        return {"pid": os.getpid(), "node_id": node_id(), "shards": self._shards,
                "actor": ray.get_runtime_context().get_actor_name()}

    def _set_shards(self, shards) -> None:
        shards = [tuple(int(x) for x in s) for s in shards]
        for s, lo, hi in shards:
            if self._srcs[s] is None:
                self._srcs[s] = self._cfg.open_source(s)
                if getattr(self, "_standby", False):
                    # opened and checked (the tokenizer loaded once); until a
                    # take-over the standby holds neither pages nor tokenizer: the
                    # first tokenization loads it again (pl_source_release_tokenizer)
                    self._srcs[s].release_pages()
                    self._srcs[s].release_tokenizer()
        # Partitions as disjoint intervals of the key (source << 40 | index), sorted
        # (while the autoscaler moves a partition, old and new ones overlap).
        parts: List[List[int]] = []
        for a, b in sorted((s << KEY_SHIFT | lo, s << KEY_SHIFT | hi) for s, lo, hi in shards):
            if parts and a <= parts[-1][1]:
                parts[-1][1] = max(parts[-1][1], b)
            else:
                parts.append([a, b])
        lo = np.asarray([p[0] for p in parts], dtype=np.int64)
        hi = np.asarray([p[1] for p in parts], dtype=np.int64)
        self._parts, self._shards = (lo, hi), shards  # read() sees old or new, whole
        _registry.kv_put(self._kv_key, pickle.dumps(shards, protocol=5))

    def set_shards(self, shards: Sequence[Tuple[int, int, int]]) -> Dict[str, Any]:
        """Serve these partitions from now on (the autoscaler moves, splits and merges
        partitions; it adds a partition here before routing reads to it and removes one
        after every reader has stopped using it).  Opens sources not open yet."""
        self._ensure_ready()
        self._set_shards(shards)
        return {"pid": os.getpid(), "node_id": node_id(), "shards": self._shards}

    def _account(self, rows: np.ndarray, tokens: np.ndarray, nbytes: int, wall: float,
                 cpu: float, delivered: bool = True,
                 ns: Optional[np.ndarray] = None) -> None:
        """Add one call to the cost profile, split over its sources: wall seconds, rows,
        tokens (delivered by reads, or tokenized by lengths calls), bytes and, for
        reads, the reading thread's CPU seconds.  Wall and CPU go by each source's
        share of the call's time measured in C (``ns``: nanoseconds per source index,
        from ``read_rows_reply``) when given, else by its share of the tokens; bytes
        by the tokens."""
        srcs = np.unique(rows).tolist()
        total = float(tokens.sum()) or 1.0
        t_total = float(ns[srcs].sum()) if ns is not None else 0.0
        with self._prof_lock:
            self._busy += wall
            for s in srcs:
                sel = rows == s
                tok = float(tokens[sel].sum())
                share = tok / total if len(srcs) > 1 else 1.0
                tshare = float(ns[s]) / t_total if t_total > 0 else share
                p = self._prof[int(s)]
                p[0] += wall * tshare
                p[1] += int(sel.sum())
                p[3] += int(nbytes * share)
                p[4] += 1
                if delivered:
                    p[2] += int(tok)
                    p[5] += cpu * tshare
                else:
                    p[6] += int(tok)

    @ray.method(enable_task_events=False)  # the autoscaler asks every interval_s
    def profile(self) -> Dict[str, Any]:
        """The measured cost profile since the actor started (counters; the autoscaler
        takes differences): ``{"cpu_s": CPU seconds of the process, "read_cpu_s": of
        which reads (their thread's ``time.thread_time``: the C read runs in it),
        "wall_s": seconds alive, "busy_s": seconds in calls, "read_split": "time"
        (with image sources: a read of several sources splits its CPU by the time C
        measured for each) or "tokens" (token-only: by tokens), "sources": {source
        index: {"busy_s",
        "rows", "tokens" (delivered by reads), "tokenized" (tokens of the lengths calls:
        raw text tokenized here), "bytes", "calls", "read_cpu_s", "tokenize_cpu_s" (CPU
        seconds of the threads that tokenized the source's documents here, measured in
        C: ``Source.tokenize_cpu_s``)}}}``.  The rest of the process's CPU time is Ray's
        and Python's own (calls, serialization, these profiles)."""
        if not self._ready:
            return {"cpu_s": 0.0, "read_cpu_s": 0.0, "wall_s": 0.0, "busy_s": 0.0,
                    "sources": {}, "shards": self._shards}
        with self._prof_lock:
            cpu = time.process_time() - self._cpu_start
            busy, read_cpu = self._busy, self._read_cpu
            seen = np.flatnonzero(self._prof[:, 4] > 0)
            per = self._prof[seen].tolist()
        tkz_cpu = [self._srcs[s].tokenize_cpu_s if self._srcs[s] is not None else 0.0
                   for s in seen.tolist()]
        return {"cpu_s": cpu, "read_cpu_s": read_cpu,
                "wall_s": time.monotonic() - self._t_start, "busy_s": busy,
                "shards": self._shards, "pid": os.getpid(),
                "read_split": "time" if self._images else "tokens",
                "sources": {s: {"busy_s": v[0], "rows": int(v[1]), "tokens": int(v[2]),
                                "bytes": int(v[3]), "calls": int(v[4]), "read_cpu_s": v[5],
                                "tokenized": int(v[6]), "tokenize_cpu_s": c}
                            for s, v, c in zip(seen.tolist(), per, tkz_cpu)}}

    @ray.method(enable_task_events=False)
    def read(self, reads: np.ndarray) -> np.ndarray:
        """The rows' tokens back to back at their sources' stored widths (uint8)."""
        self._ensure_ready()
        reads = np.ascontiguousarray(reads, dtype=np.int64).reshape(-1, 4)
        key = reads[:, 0] << KEY_SHIFT | reads[:, 1]
        lo, hi = self._parts
        i = np.searchsorted(lo, key, side="right") - 1
        ok = (i >= 0) & (key < hi[np.maximum(i, 0)]) if len(lo) else np.zeros(len(key), bool)
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise polyload.RangeError(
                _core.ERANGE, "ERANGE",
                f"source loader {ray.get_runtime_context().get_actor_name()}: document "
                f"{int(reads[j, 1])} of source {int(reads[j, 0])} is outside its partitions "
                f"{self._shards}")
        self._standby = False  # serving: a standby took over
        # With images, a call that reads several sources is timed per source in C and
        # its CPU split by those times (the decodes are not charged to the tokens read
        # beside them).  Token-only calls are split by tokens: copying tokens costs
        # about the same per token for every source, and a clock reading per change of
        # source was 4-11 % of such a call when sources alternate row by row.
        ns = np.zeros(len(self._srcs), np.int64) if self._images and len(reads) and \
            (reads[:, 0] != reads[0, 0]).any() else None
        t0, c0 = time.monotonic(), time.thread_time()
        if self._images:
            out = self._read_reply(reads, ns)
            cpu = time.thread_time() - c0
            with self._prof_lock:
                self._read_cpu += cpu
            self._account(reads[:, 0], reads[:, 3], len(out), time.monotonic() - t0, cpu,
                          ns=ns)
            return out
        data, _offsets = _core.read_rows_raw(self._srcs, reads)
        cpu = time.thread_time() - c0
        with self._prof_lock:
            self._read_cpu += cpu
        self._account(reads[:, 0], reads[:, 3], len(data), time.monotonic() - t0, cpu)
        return np.frombuffer(data, dtype=np.uint8)

    def _read_reply(self, reads: np.ndarray, ns: Optional[np.ndarray] = None) -> np.ndarray:
        """The reply of a deployment with image-text sources (``pl_reply_encode``, one C
        call): the rows' tokens at stored width plus the image of every row that holds a
        sample's placeholder run, decoded and resized here (the sample-level work of a
        source loader); a bad image travels as its error, which the micro-batch that
        needs it reports.  Parsed by the constructor in C (``complete_replies``)."""
        return np.frombuffer(_core.read_rows_reply(self._srcs, reads, ns), dtype=np.uint8)

    @ray.method(enable_task_events=False)
    def lengths(self, source: int, indices: List[int]):
        """Lengths of documents of a raw text source, tokenized here in batches (the
        tokens stay for the constructors' reads): ``(lengths, {position: message})``, a
        bad document's length being its negative PL_E* code."""
        self._ensure_ready()
        src = self._srcs[int(source)]
        t0 = time.monotonic()
        lens = src.lengths(indices)
        self._account(np.full(len(lens), int(source), np.int64),
                      np.maximum(np.asarray(lens, dtype=np.int64), 0), 0,
                      time.monotonic() - t0, 0.0, delivered=False)
        msgs = {}
        for j, v in enumerate(lens):
            if v < 0:
                try:
                    src.document_length(indices[j])
                except polyload.PolyloadError as e:
                    msgs[j] = e.message
        return lens, msgs

    @ray.method(enable_task_events=False)  # once per source: no record per source in the GCS
    def calibrate(self, source: int, count: int = 32, seed: int = 0) -> Dict[str, float]:
        """Measure a source's cost before any traffic (the autoscaler sizes pools of
        sources the schedule has not used yet): tokenize (raw text) and read ``count``
        documents of this loader's partitions of it, picked at random.  ``{"cpu_s",
        "tokens", "docs"}``: CPU seconds of the process (its tokenizing threads
        included) for those tokens."""
        self._ensure_ready()
        src = self._srcs[int(source)]
        mine = [(lo, hi) for s, lo, hi in self._shards if s == int(source)]
        if src is None or not mine:
            raise polyload.RangeError(_core.ERANGE, "ERANGE",
                                      f"calibrate: source {source} is not held here")
        rng = np.random.default_rng(seed)
        docs = sorted({int(rng.integers(lo, hi)) for lo, hi in mine for _ in range(count)})
        docs = docs[:count]
        c0 = time.process_time()
        lens = [max(0, int(x)) for x in src.lengths(docs)]
        reads = np.asarray([[int(source), d, 0, n] for d, n in zip(docs, lens) if n > 0],
                           dtype=np.int64).reshape(-1, 4)
        srcs = [None] * len(self._srcs)
        srcs[int(source)] = src
        if len(reads):  # as read() answers: with images decoded where there are any
            (_core.read_rows_reply if self._images else _core.read_rows_raw)(srcs, reads)
        return {"cpu_s": time.process_time() - c0, "tokens": float(sum(lens)),
                "docs": float(len(docs))}

    def tokenizers(self) -> Dict[int, Optional[Dict[str, Any]]]:
        """Per source held: its tokenizer (``Source.tokenizer_state``: ``{"loaded",
        "loads", "shared_by"}``, None for a source without one).  A standby holds none
        loaded until it takes over; sources of one tokenizer file share one."""
        self._ensure_ready()
        return {s: src.tokenizer_state() for s, src in enumerate(self._srcs)
                if src is not None}

    def num_tokenized(self) -> Dict[int, int]:
        """Documents tokenized so far, per source held (raw text sources)."""
        self._ensure_ready()
        return {s: src.num_tokenized for s, src in enumerate(self._srcs) if src is not None}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass  # the sources close with the process
