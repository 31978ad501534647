"""The embedded loader as a Python iterator: :class:`Loader` (SPEC sections 3 and 7) and
:func:`eval_loader`, over the C loader of ``polyload._core``."""

from __future__ import annotations

import logging
import operator
import os
import time
import warnings
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

from ._config import ConfigLike, _default_rank, _fit_world_size, _issue_warnings, _make_config
from ._errors import PolyloadError, RangeError
from ._extension import _core, _require_core
from ._log import logger

__all__ = ["Loader", "eval_loader", "STATE_VERSION"]

_perf_counter = time.perf_counter

#: Version of the dict that :meth:`Loader.state_dict` returns.
STATE_VERSION = 1

#: The batch fields that are arrays, in SPEC section 3 order.
_ARRAY_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens")
#: Image fields, present when a micro-batch holds images (webdataset sources).
_IMAGE_FIELDS = ("pixel_values", "image_grid_thw", "image_positions")


def _field_bits():
    """(name, FIELD_* bit) of the array fields, in SPEC section 3 order."""
    core = _require_core()
    return tuple((n, getattr(core, "FIELD_" + n.upper())) for n in _ARRAY_FIELDS)


def _as_rank(rank: Any) -> int:
    """An integer rank; floats, strings and bools are refused (TypeError)."""
    if isinstance(rank, bool):
        raise TypeError(f"polyload: a rank must be an int, got {rank!r}")
    return operator.index(rank)


def _state_blob(state: Any) -> bytes:
    """The blob of a ``state_dict()`` mapping, checked (TypeError, ValueError)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"polyload: a state must be a mapping from state_dict(), got "
                        f"{type(state).__name__}")
    version = state.get("version")
    if type(version) is not int or version != STATE_VERSION:
        raise ValueError(f"unsupported polyload state version {version!r} (expected {STATE_VERSION})")
    if "blob" not in state:
        raise ValueError("polyload: the state has no 'blob'")
    blob = state["blob"]
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"polyload: state['blob'] must be bytes, got {type(blob).__name__}")
    return bytes(blob)


def _import_torch():
    try:
        import torch  # noqa: PLC0415 - optional and lazy

        return torch
    except ImportError:
        return None


class Loader:
    """An iterator of micro-batches for one global rank (SPEC sections 3 and 7).

    Args:
        config: a YAML file path, a dict with the keys of SPEC section 5 (dumped with
            ``yaml.safe_dump`` and parsed by the C library), or a ``polyload._core.Config``.
            Relative source paths are relative to the current directory.
        rank: the global rank whose batches iteration yields.  Default:
            ``torch.distributed.get_rank()`` when initialized, else ``$RANK``, else 0.
        ranks: the global ranks this loader serves (builds batches for).  Default:
            ``[rank]``.  Must contain ``rank``.  Use :meth:`next_batch` for the others.
        pin_memory: copy each tensor into pinned memory (a copy, so not zero-copy).  On a
            torch without CUDA it is a no-op and warns once.
        threads: worker threads; None takes the config's ``threads``.
        prefetch: micro-batches prefetched per served rank; None takes the config's.
        with_sources: add where each batch comes from: ``segment_sources`` (int32
            ``[n_segments]``, the index into :attr:`source_names` of the source of each
            segment of ``cu_seqlens``, -1 for a row's trailing padding), ``step`` and
            ``micro_batch`` (ints).  Present wherever ``cu_seqlens`` is.

    Iteration yields one dict per micro-batch, ending after ``train_steps``:

    ===============  ================================  ===================================
    key              shape                             dtype
    ===============  ================================  ===================================
    ``input_ids``    ``[micro_batch_size, seq/cp]``    int64 (int32 with ``dtype: int32``)
    ``labels``       same                              same; -100 where loss_mask is 0
    ``loss_mask``    same                              float32
    ``position_ids`` same                              int64, restarting at each segment
    ``cu_seqlens``   ``[n_segments + 1]``              int32, over the flattened tokens
    ``max_seqlen``   scalar                            int (tokens)
    ``pixel_values`` fixed ``[n_images, 3, H, W]``;    uint8 (normalize on the device)
                     native ``[n_patches, 3*p*p]``
    ``image_grid_thw`` ``[n_images, 3]``               int64 (t, h, w in patches)
    ``image_positions`` ``[n_images, 2]``              int64 (flat offset in input_ids, count)
    ===============  ================================  ===================================

    The image fields are present only in micro-batches that hold images.

    Fields the rank does not receive (pipeline stages, SPEC section 2) are absent.
    Values are ``torch.Tensor`` when torch is installed, else ``numpy.ndarray``.  The
    C memory of a micro-batch is shared by the served ranks of its (DP, CP) group (TP
    peers and PP stages), so it is exported read-only: NumPy arrays are read-only
    views (a write raises ``ValueError``).  torch has no read-only tensors, so a rank
    whose group this loader serves alone (one rank per process, the usual case) gets
    zero-copy tensors that are its own to modify, and a rank that shares its group with
    another served rank gets private copies.  Either way the memory returns to the
    loader's pool when the last tensor or array using it is gone.

    The topology must match the trainer: when ``torch.distributed`` is initialized (or
    ``$WORLD_SIZE`` is set), ``dp * pp * cp * tp`` must equal its world size, and
    ``topology.dp: auto`` takes dp from it (:func:`trainer_world_size`).  The config's
    warnings (weights normalized, ...) are issued as :class:`ConfigWarning`.

    Raises:
        PolyloadIOError: a source file is missing or unreadable.
        FormatError: a source file is corrupt (the message names file, field, offset).
        ConfigError: the config is invalid (the message names the key), or its world size
            differs from the trainer's (the message names both).
        RangeError: ``rank`` or a rank of ``ranks`` is outside the topology (the message
            names the topology and the trainer's world size or ``$WORLD_SIZE``).

    A Loader is a context manager; :meth:`close` frees it.  It is not picklable (build
    one per process from the config).  After ``os.fork`` the child must not use the
    parent's Loader; deleting it there leaks its C state on purpose instead of freeing
    memory that the parent's threads own.
    """

    def __init__(
        self,
        config: ConfigLike,
        rank: Optional[int] = None,
        ranks: Optional[Sequence[int]] = None,
        pin_memory: bool = False,
        threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        *,
        with_sources: bool = False,
        _external: bool = False,
    ) -> None:
        core = _require_core()
        self._loader = None
        cfg = _make_config(config)
        _issue_warnings(cfg, stacklevel=2)
        trainer_world = _fit_world_size(cfg)
        self.rank = _default_rank() if rank is None else _as_rank(rank)
        served = [self.rank] if ranks is None else [_as_rank(r) for r in ranks]
        if self.rank not in served:
            raise ValueError(f"rank {self.rank} is not among ranks {served}")
        for r in served:
            try:
                cfg.rank_info(r)  # RangeError naming the topology for a bad rank
            except RangeError as e:
                env = os.environ.get("WORLD_SIZE")
                where = (f"the trainer's world size is {trainer_world}" if trainer_world
                         else "WORLD_SIZE is " + (repr(env) if env is not None else "not set"))
                raise RangeError(e.code, e.name, f"{e.message}; {where}") from None
        self._torch = _import_torch()
        self._pin = False
        if pin_memory:
            if self._torch is not None and self._torch.cuda.is_available():
                self._pin = True
            else:
                logger.warning("Loader: pin_memory=True ignored (torch without CUDA)")
                warnings.warn(
                    "polyload.Loader: pin_memory=True ignored (torch without CUDA)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self.config = cfg
        self.world_size = cfg.world_size()
        self.rank_info: Dict[str, int] = cfg.rank_info(self.rank)
        self._loader = core.Loader.create(
            cfg, ranks=served, threads=threads or 0, prefetch=prefetch or 0,
            external=_external,
        )
        self._served, self._threads, self._prefetch = served, threads, prefetch
        self._with_sources = bool(with_sources)
        self._source_names: Optional[tuple] = None  # made at the first source_names
        if logger.isEnabledFor(logging.INFO):
            ri = self.rank_info
            logger.info(
                "Loader: rank %d (dp %d, pp %d, cp %d, tp %d) of world %d%s serves ranks %s; "
                "%d sources (%s), seq_length %d, global_batch_size %d, micro_batch_size %d, "
                "train_steps %s",
                self.rank, ri["dp_rank"], ri["pp_rank"], ri["cp_rank"], ri["tp_rank"],
                self.world_size, " (external)" if _external else "", served,
                cfg.num_sources, ", ".join(self.source_names),
                cfg.get_int("seq_length"), cfg.get_int("global_batch_size"),
                cfg.get_int("micro_batch_size"),
                cfg.get_int("train_steps") if cfg.get_int("train_steps") >= 0 else "endless")
        self._t0: Optional[float] = None
        self._t1: Optional[float] = None
        import numpy as np  # noqa: PLC0415

        self._np = np
        self._wrap = self._torch.from_numpy if self._torch is not None else None
        # torch.from_dlpack of a capsule checks its argument in Python and calls
        # torch._C._from_dlpack: the hot path calls the latter directly (0.15 us per
        # field less), where this torch has it.
        self._from_dlpack = (getattr(self._torch._C, "_from_dlpack", self._torch.from_dlpack)
                             if self._torch is not None else None)
        self._convert: Dict[int, tuple] = {}  # rank -> (convert, writable, dlpack) of to_dict
        groups: Dict[tuple, int] = {}
        infos = {r: cfg.rank_info(r) for r in served}
        for info in infos.values():
            key = (info["dp_rank"], info["cp_rank"])
            groups[key] = groups.get(key, 0) + 1
        self._group_size = {r: groups[(i["dp_rank"], i["cp_rank"])] for r, i in infos.items()}

    # ------------------------------------------------------------------ iteration

    @property
    def source_names(self) -> tuple:
        """Source names by config index (what ``segment_sources`` values index); made
        from the config at the first use, so a loader that never needs them (a
        trainer's ``polyload.ray.Client`` of a deployment with many sources) keeps
        none."""
        if self._source_names is None:
            cfg = self.config
            self._source_names = tuple(cfg.source_name(i) for i in range(cfg.num_sources))
        return self._source_names

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        batch = self.next_batch(self.rank)
        if batch is None:
            raise StopIteration
        return batch

    def next_batch(self, rank: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """The next micro-batch dict of a served ``rank`` (default: ``self.rank``), or
        None after ``train_steps``.  Blocks (without the GIL) until it is built.

        Raises:
            RangeError: ``rank`` is not served by this loader.
            PolyloadError: building the batch failed (the loader then fails; later calls
                raise with code ECLOSED).
        """
        # The hot path: one C call per micro-batch (Loader.next_dict) takes the batch
        # and builds its dict, with no Batch object.
        loader = self._loader
        if loader is None:
            loader = self._handle()
        if self._t0 is None:
            self._t0 = _perf_counter()
        r = self.rank if rank is None else rank if type(rank) is int else _as_rank(rank)
        conv = self._convert.get(r)
        if conv is None:
            conv = self._converter(r)
        if self._with_sources:
            b = loader.next(r)
            d = None if b is None else self._to_dict(b, conv)
        else:
            d = loader.next_dict(r, conv)
        self._t1 = _perf_counter()
        if d is None and not getattr(self, "_logged_end", False):
            self._logged_end = True
            logger.info("Loader: rank %d reached the end of its data", r)
        return d

    def _to_dict(self, b, conv) -> Dict[str, Any]:
        """The dict of Batch ``b`` with its sources (``with_sources``)."""
        d = b.to_dict(conv[0], writable=conv[1], dlpack=conv[2])  # image fields included
        seg = b.segment_sources
        if seg is not None:  # small: a private copy, converted as the other fields
            x = self._np.array(seg)
            for f in conv[0][1:] if conv[0] else ():
                x = f(x)
            d["segment_sources"] = x
        d["step"] = b.step
        d["micro_batch"] = b.micro_batch
        return d

    def _converter(self, rank: int):
        """(convert, writable, dlpack) of Batch.to_dict for a served rank.

        Batch memory is shared by the served ranks of one (DP, CP) group (TP peers
        and PP stages get views of one build).  NumPy arrays (torch absent) are
        read-only views.  torch has no read-only tensors, so a rank whose group this
        loader serves alone gets writable zero-copy tensors (an in-place change
        reaches no other rank), made by torch.from_dlpack from one DLPack capsule
        per field (one C call each, instead of an Array, a NumPy array and
        torch.from_numpy), and a rank that shares its group gets private copies.
        ``convert`` also serves ``segment_sources`` (always a private copy).  A rank
        not served gets an export that is not kept (next_dict raises RangeError).
        """
        np = self._np
        if rank not in self._group_size:
            return (None, False, None)
        if self._wrap is None:
            conv = ((np.asarray,), False, None)
        elif self._pin:  # pin_memory copies: the tensor is private
            conv = ((np.asarray, self._wrap, self._torch.Tensor.pin_memory), True, None)
        elif self._group_size[rank] == 1:
            conv = ((np.asarray, self._wrap), True, self._from_dlpack)
        else:
            conv = ((np.array, self._wrap), False, None)
        self._convert[rank] = conv
        return conv

    # ---------------------------------------------------------------------- state

    def state_dict(self) -> Dict[str, Any]:
        """``{"version": 1, "blob": bytes}``: the position after the batches consumed
        so far (not the prefetched ones), the same on every rank (SPEC section 4)."""
        return {"version": STATE_VERSION, "blob": self._handle().get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly from ``state`` (from :meth:`state_dict`, maybe of another
        process, dp size, thread count or mixture).  Drops prefetched batches.

        Raises:
            StateError: corrupt blob, or a fingerprint field (seq_length,
                global_batch_size, micro_batch_size, packing, long_documents, seed,
                topology.cp, a source's path or document count) differs, a source
                of the state is missing, a mid-step state meets another dp,
                balance, long_short, cost or max_epochs, or a version-1 mid-step
                state meets other weights; the message names the field.  A mid-step state with other weights, schedule or
                sources finishes its step as planned; the new mixture applies from
                the next step.
            TypeError: ``state`` is not a mapping with a bytes-like ``blob``.
            ValueError: an unknown ``version``, or no ``blob``.
        """
        blob = _state_blob(state)
        self._handle().set_state(blob)
        if logger.isEnabledFor(logging.INFO):
            info = _require_core().state_info(blob)
            logger.info("Loader: rank %d resumes at step %d, micro-batch %d (%d-byte state)",
                        self.rank, info["step"], info["micro_batch"], len(blob))

    # ---------------------------------------------------------------------- stats

    def stats(self) -> Dict[str, Any]:
        """The run summary so far, with the fields of ``polyload run --json`` (SPEC 6).

        ``{"steps", "tokens" (non-padding), "padding_fraction", "tokens_per_s",
        "seconds" (from the first batch request to the last batch), "skipped",
        "data_wait_s" (seconds the batch requests blocked waiting for a batch, the
        first request of each rank, which waits for the pipeline to fill, left out),
        "images_replaced" (images that did not decode, replaced by blank ones under
        ``on_error: skip``),
        "imbalance": {"max_over_mean", "max_over_lower_bound"} (None before a step
        completes), "sources": {NAME: {"documents", "tokens", "epochs_completed",
        "realized_fraction", "scheduled_fraction"}}}``.  Counts cover the ranks this
        loader serves.

        ``tokens`` and the per-source ``tokens`` count different things, so their sum
        is not ``tokens``: ``tokens`` counts the non-padding tokens of the micro-batches
        this loader's ranks took (the current step's in part); a source's ``tokens`` is
        what the planner drew from it for the whole global batch (every DP rank) up to
        the start of the current step, chunks drawn and carried over into that step
        included.  A loader serving every rank, read at a step boundary of a run without
        carried-over chunks, has them equal; a loader serving one of ``dp`` ranks has
        ``tokens`` near ``1/dp`` of the sum.
        """
        st = self._handle().stats()
        secs = (self._t1 - self._t0) if self._t0 is not None and self._t1 is not None else 0.0
        all_tokens = st["tokens"] + st["padding_tokens"]
        return {
            "steps": st["steps"],
            "tokens": st["tokens"],
            "padding_fraction": st["padding_tokens"] / all_tokens if all_tokens else 0.0,
            "tokens_per_s": st["tokens"] / secs if secs > 0 else 0.0,
            "seconds": secs,
            "skipped": st["skipped"],
            "data_wait_s": st["data_wait_s"],
            "images_replaced": st["images_replaced"],
            "imbalance": {
                "max_over_mean": st["max_over_mean"] if st["max_over_mean"] > 0 else None,
                "max_over_lower_bound": (
                    st["max_over_lower_bound"] if st["max_over_lower_bound"] > 0 else None
                ),
            },
            "sources": {
                name: {
                    "documents": s["documents"],
                    "tokens": s["tokens"],
                    "epochs_completed": s["epochs_completed"],
                    "realized_fraction": s["realized_fraction"],
                    "scheduled_fraction": s["scheduled_fraction"],
                }
                for name, s in st["sources"].items()
            },
        }

    # ----------------------------------------------------------------- evaluation

    def eval_iter(self, split: str = "valid", steps: Optional[int] = None,
                  threads: Optional[int] = None,
                  prefetch: Optional[int] = None) -> "Loader":
        """A new :class:`Loader` for one evaluation pass over the ``"valid"`` or
        ``"test"`` data, for this loader's rank(s).

        The data are the config's ``split`` fractions of each source (``split: 969,30,1``,
        Megatron's ``--split``: documents ``[round(lo * n), round(hi * n))`` of each
        source, in index order) or its ``valid_sources`` / ``test_sources`` lists
        (Megatron's ``blend_per_split``).  The pass reads every document of the split once,
        in index order within a source, mixed across sources by the largest-deficit rule
        and packed as training packs, in steps of ``global_batch_size`` sequences; the
        last step may end with all-padding rows (``loss_mask`` 0; a micro-batch of such
        rows has no label, so its mean loss is NaN: weight losses by label counts, as
        :func:`polyload.hf.evaluate` does).  Iteration ends after
        the pass, or after ``steps`` steps.  The pass is a pure function of the config:
        the same on every rank, at every call and whatever the training position, and it
        neither reads nor changes this loader's state.  Its :meth:`stats` count the pass
        alone.  Close it (or use ``with``) when done; a new call starts a new pass.  On a
        :class:`polyload.ray.Client` the pass runs in this process (an embedded loader, so
        it needs the data files).

        Raises:
            ConfigError: the config has no data for ``split``, or ``steps`` < 1.
            ValueError: ``split`` is not ``"valid"`` or ``"test"``.
        """
        self._handle()  # ECLOSED after close()
        cfg = self.config.split(split)
        if steps is not None:
            cfg.set("train_steps", int(steps))
        logger.info("Loader: evaluation pass over the %s data (%s)", split,
                    f"{int(steps)} steps" if steps is not None else "every document")
        return Loader(cfg, rank=self.rank, ranks=self._served,
                      threads=threads if threads is not None else self._threads,
                      prefetch=prefetch if prefetch is not None else self._prefetch,
                      with_sources=self._with_sources)

    # -------------------------------------------------------------------- closing

    def _handle(self):
        if self._loader is None:
            raise PolyloadError(_core.ECLOSED if _core else -17, "ECLOSED", "loader is closed")
        return self._loader

    def close(self) -> None:
        """Stop the worker threads and free the C loader.  Batches already returned stay
        valid.  Idempotent."""
        loader, self._loader = self._loader, None
        if loader is not None:
            loader.close()

    @property
    def closed(self) -> bool:
        return self._loader is None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError(
            "polyload.Loader is not picklable: it holds C state of this process; "
            "pass the config and create the Loader where it is used"
        )

    def __repr__(self) -> str:
        state = "closed" if self._loader is None else f"ranks={self._loader.ranks}"
        return f"<polyload.Loader rank={self.rank} {state}>"


def eval_loader(config: ConfigLike, split: str = "valid", steps: Optional[int] = None,
                rank: Optional[int] = None, ranks: Optional[Sequence[int]] = None,
                threads: Optional[int] = None, prefetch: Optional[int] = None,
                with_sources: bool = False) -> Loader:
    """A :class:`Loader` for one evaluation pass over a config's ``"valid"`` or ``"test"``
    data, without a training loader: the same as ``Loader(config).eval_iter(split,
    steps)`` (see :meth:`Loader.eval_iter`).  ``rank`` defaults as for :class:`Loader`.

    Raises:
        ConfigError: the config has no data for ``split``, or ``steps`` < 1.
        ValueError: ``split`` is not ``"valid"`` or ``"test"``.
    """
    cfg = _make_config(config)
    _issue_warnings(cfg, stacklevel=2)
    _fit_world_size(cfg)
    ev = cfg.split(split)
    if steps is not None:
        ev.set("train_steps", int(steps))
    return Loader(ev, rank=rank, ranks=ranks, threads=threads, prefetch=prefetch,
                  with_sources=with_sources)
