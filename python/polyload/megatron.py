"""Megatron-LM integration: what ``pretrain_gpt.py --dataloader-type external`` needs.

With ``--dataloader-type external`` Megatron-LM calls the datasets provider and uses what it
returns as the data iterator as is (wrapped in its ``RerunDataIterator``).  This module
gives that iterator and the pieces around it:

- :class:`MegatronIterator`: micro-batches under Megatron's names (``tokens``, ``labels``,
  ``loss_mask``, ``position_ids``, ``attention_mask`` = None) plus a megatron-core
  ``PackedSeqParams`` for the THD (packed) layout, so attention stays within documents;
- :func:`get_batch`: a drop-in for ``pretrain_gpt.get_batch`` returning those fields and
  the ``PackedSeqParams`` (to pass as ``model(..., packed_seq_params=...)``);
- :func:`check_args`: Megatron's arguments against the polyload config (seq_length, global
  and micro batch sizes, seed, train iterations, tp/pp/cp/dp sizes), a ``ConfigError``
  naming both values when they differ;
- :func:`save_checkpoint_state` / :func:`load_checkpoint_state`: the loader's state next to
  Megatron's checkpoint (``<dir>/iter_0000100/polyload_state.pt``); the iterator also has
  ``save_state()`` / ``restore_state()``, the hook names Megatron-LM's
  ``maybe_save_dataloader_state`` calls.

Conventions (the same as Megatron's GPTDataset):

- ``labels`` are already shifted: ``labels[t]`` is the token after ``tokens[t]`` within the
  document, -100 where ``loss_mask`` is 0 (each document's last token, padding).  Megatron's
  loss uses them as they are.
- polyload never trains across documents, so its batches behave as Megatron's
  ``--reset-position-ids --reset-attention-mask --eod-mask-loss`` (positions restart at 0 in
  each document; the THD ``cu_seqlens`` keep attention within a document; the position whose
  label would be the next document's first token has no loss).  :func:`check_args` warns
  when those flags are off, since the batches do not follow them.

Layout under THD.  Megatron's packed format is one row: ``tokens`` is ``[1, rows * cols]``,
the polyload micro-batch's rows laid end to end (``cols = seq_length / cp``), which is what
polyload's ``cu_seqlens`` index.  A row's trailing padding is a segment of its own (no loss).

Context parallelism.  polyload cuts every segment (document or padding) into ``2*cp``
pieces and gives CP rank ``i`` pieces ``i`` and ``2*cp-1-i`` (each document padded to a
multiple of ``2*cp``), the load-balanced layout of Transformer Engine's THD attention
(``thd_get_partitioned_indices``).  A CP rank's ``batch["cu_seqlens"]`` are offsets over its
*own* tokens, i.e. the global padded offsets divided by cp; Transformer Engine and
megatron-core's THD RoPE want the global padded offsets (they divide by cp themselves), so
``PackedSeqParams.cu_seqlens_q_padded`` is ``cp * batch["cu_seqlens"]`` and
``max_seqlen_q`` is ``cp * batch["max_seqlen"]``.  ``cu_seqlens_q`` (the unpadded offsets)
equals the padded one: a CP rank does not see where the padding of a document that another
CP rank holds starts, and it need not: the padding follows its document's real tokens, so
under causal attention no real token attends to it, and it has no loss.  With cp = 1 there
is no padding inside a segment and both are exact.

Pipeline stages receive only their fields (SPEC section 2): the others are None.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import torch

from . import ConfigError, Loader, _make_config, eval_loader
from .torch import IMAGE_FIELDS

__all__ = [
    "MegatronIterator",
    "MegatronEvalIterator",
    "get_batch",
    "packed_seq_params",
    "check_args",
    "per_token_loss",
    "save_checkpoint_state",
    "load_checkpoint_state",
    "STATE_FILE",
]

logger = logging.getLogger("polyload.megatron")

#: File name of the loader state inside a Megatron checkpoint's ``iter_NNNNNNN`` directory.
STATE_FILE = "polyload_state.pt"
#: Megatron-LM's tracker file of the latest checkpointed iteration.
_TRACKER = "latest_checkpointed_iteration.txt"


def packed_seq_params(batch: Mapping[str, Any], cp: int, device=None):
    """megatron-core's ``PackedSeqParams`` (``qkv_format='thd'``) for a polyload batch.

    Args:
        batch: a polyload micro-batch dict (``cu_seqlens`` int32 ``[n_segments + 1]`` over
            this CP rank's flattened tokens, ``max_seqlen``).
        cp: the context-parallel size (``topology.cp``).
        device: where the int32 offset tensors go (default: where ``cu_seqlens`` is).

    Returns ``PackedSeqParams(qkv_format="thd", cu_seqlens_q, cu_seqlens_kv,
    cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv)``, all offsets
    the global padded ones (``cp * batch["cu_seqlens"]``, see the module docstring).
    """
    from megatron.core.packed_seq_params import PackedSeqParams  # noqa: PLC0415

    cu = torch.as_tensor(batch["cu_seqlens"])
    if device is not None:
        cu = cu.to(device)
    cu = (cu.to(torch.int32) * int(cp)).to(torch.int32)
    max_len = int(batch["max_seqlen"]) * int(cp)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=max_len,
        max_seqlen_kv=max_len,
    )


class MegatronIterator:
    """An iterator of Megatron-style micro-batches from a :class:`polyload.Loader`.

    Args:
        loader: a :class:`polyload.Loader`, or a config (path, dict or ``_core.Config``)
            for which one is created with ``rank`` and ``**loader_kwargs``.
        rank: the global rank whose batches to yield (default: the loader's rank).
        device: where tensors go (default: ``cuda`` when available, else ``cpu``).

    Each ``next`` yields one micro-batch dict:

    ====================  =====================  =======================================
    key                   shape                  dtype / meaning
    ====================  =====================  =======================================
    ``tokens``            ``[1, rows * cols]``   int64 (int32 with ``dtype: int32``)
    ``labels``            same                   same; shifted, -100 where no loss
    ``loss_mask``         same                   float32
    ``position_ids``      same                   int64, restarting in each document
    ``attention_mask``    None                   the THD cu_seqlens replace it
    ``packed_seq_params`` ``PackedSeqParams``    global padded offsets (module docstring)
    ====================  =====================  =======================================

    with ``rows = micro_batch_size`` and ``cols = seq_length / cp``.  Fields a pipeline stage
    does not receive are None.  Micro-batches that hold images (webdataset sources) add
    polyload's image fields, on ``device``: ``pixel_values`` uint8 (fixed mode ``[n_images,
    3, H, W]``, native ``[n_patches, 3 * p * p]``; normalize on the device, e.g. with
    :func:`polyload.torch.normalize_images`), ``image_grid_thw`` int64 ``[n_images, 3]`` and
    ``image_positions`` int64 ``[n_images, 2]`` (offset of each image's placeholder run in
    the flattened ``tokens``, and its length).  The sequence holds one placeholder per
    visual token, the layout of transformers' vision-language models; megatron-core's
    ``LLaVAModel`` instead expects one ``image_token_index`` per image and expands it
    itself, so feed these fields to a model that embeds images at ``image_positions``
    (as ``examples/train_vlm.py`` does).  Iteration ends after ``train_steps``.  The tensors share
    the loader's memory when ``device`` is the CPU: do not modify them in place.
    """

    def __init__(self, loader: Union[Loader, Any], rank: Optional[int] = None,
                 device: Optional[Union[str, torch.device]] = None, **loader_kwargs) -> None:
        if not isinstance(loader, Loader):
            loader = Loader(loader, rank=rank, **loader_kwargs)
        elif loader_kwargs:
            raise TypeError("MegatronIterator: loader keyword arguments need a config, "
                            "not a Loader")
        self.loader = loader
        self.rank = loader.rank if rank is None else rank
        self.cp = loader.config.get_int("topology.cp")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        b = self.loader.next_batch(self.rank)
        if b is None:
            raise StopIteration
        return self.convert(b)

    def convert(self, b: Mapping[str, Any]) -> Dict[str, Any]:
        """The Megatron dict of one polyload micro-batch dict (see the class docstring)."""
        dev = self.device

        def flat(name):
            t = b.get(name)
            if t is None:
                return None
            t = t.reshape(1, -1)
            return t if dev.type == "cpu" else t.to(dev, non_blocking=True)

        out = {
            "tokens": flat("input_ids"),
            "labels": flat("labels"),
            "loss_mask": flat("loss_mask"),
            "position_ids": flat("position_ids"),
            "attention_mask": None,
            "packed_seq_params": packed_seq_params(b, self.cp, device=dev),
        }
        for name in IMAGE_FIELDS:  # present in micro-batches with images only
            t = b.get(name)
            if t is not None:
                out[name] = t if dev.type == "cpu" else t.to(dev, non_blocking=True)
        return out

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        """The loader's ``state_dict()``: the position after the consumed micro-batches,
        the same on every rank."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    # The names Megatron-LM's maybe_save_dataloader_state calls (as for Energon loaders).
    save_state = state_dict
    restore_state = load_state_dict

    def close(self) -> None:
        self.loader.close()

    def __enter__(self) -> "MegatronIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MegatronEvalIterator(MegatronIterator):
    """Megatron-style micro-batches of the validation (or test) data, for the second (or
    third) iterator that the datasets provider returns.

    Megatron-LM's ``evaluate`` draws ``eval_iters`` steps of micro-batches from the same
    iterator at every evaluation.  This iterator reads a fresh polyload evaluation pass
    (:meth:`polyload.Loader.eval_iter`) of ``eval_iters`` steps (or the whole split when
    None) and starts the same pass again when it ends, so every evaluation sees the same
    batches, whatever the training position.  The batches are :class:`MegatronIterator`'s.

    Args:
        config: a polyload config (path, dict, ``_core.Config``) or a training
            :class:`polyload.Loader` (its config, rank and ranks are used).
        split: ``"valid"`` or ``"test"``.
        eval_iters: steps per evaluation (Megatron's ``--eval-iters``), or None.
        rank, device: as for :class:`MegatronIterator`.

    Raises:
        ConfigError: the config has no data for ``split``.
    """

    def __init__(self, config: Any, split: str = "valid", eval_iters: Optional[int] = None,
                 rank: Optional[int] = None,
                 device: Optional[Union[str, torch.device]] = None, **loader_kwargs) -> None:
        if isinstance(config, Loader):
            self._new = lambda: config.eval_iter(split, steps=eval_iters)
        else:
            self._new = lambda: eval_loader(config, split, steps=eval_iters, rank=rank,
                                            **loader_kwargs)
        self.split, self.eval_iters = split, eval_iters
        super().__init__(self._new(), rank=rank, device=device)

    def __next__(self) -> Dict[str, Any]:
        b = self.loader.next_batch(self.rank)
        if b is None:  # the pass ended: the next evaluation reads it again
            self.loader.close()
            self.loader = self._new()
            b = self.loader.next_batch(self.rank)
            if b is None:
                raise StopIteration
        return self.convert(b)


def get_batch(data_iterator) -> Tuple[Any, Any, Any, Any, Any, Any]:
    """A drop-in for ``pretrain_gpt.get_batch``: ``(tokens, labels, loss_mask,
    attention_mask, position_ids, packed_seq_params)`` of the next micro-batch.

    Call ``model(tokens, position_ids, attention_mask, labels=labels,
    packed_seq_params=packed_seq_params)``.  Do not apply Megatron's
    ``get_batch_on_this_cp_rank`` afterwards: the batch is already this CP rank's slice
    (per document, see the module docstring), and ``get_batch_on_this_tp_rank`` is not
    needed either: TP peers get identical batches from their own iterators (or use
    :func:`polyload.torch.broadcast_tp` to read once per TP group).  ``data_iterator`` is a
    :class:`MegatronIterator`, possibly wrapped in Megatron's ``RerunDataIterator``.
    """
    d = next(data_iterator)  # a RerunDataIterator forwards next()
    return (d["tokens"], d["labels"], d["loss_mask"], d["attention_mask"],
            d["position_ids"], d["packed_seq_params"])


# ----------------------------------------------------------------- arguments

#: ``Config.get_int("balance")`` of ``balance: variable_length``.
BALANCE_VARIABLE_LENGTH = 3


def per_token_loss(losses: Any, loss_mask: Any):
    """A ``loss_func`` result for Megatron's ``--calculate-per-token-loss``.

    Args:
        losses: the model's per-token losses of the micro-batch (any shape).
        loss_mask: the batch's ``loss_mask`` (same number of elements).

    Returns ``(loss_sum, num_tokens, {"lm loss": tensor([loss_sum, num_tokens])})``:
    Megatron sums ``num_tokens`` over the step's micro-batches and all-reduces it over the
    data-parallel (and context-parallel) ranks, which makes it the step's count of loss
    tokens (``step_loss_tokens`` of the polyload batch), and divides the gradients by it:
    the per-token mean over the whole step, exact when DP ranks carry unequal token counts
    (``balance: variable_length``).  A per-micro-batch mean (Megatron's default) weighs a
    rank's tokens by 1 / its token count instead.
    """
    import torch  # noqa: PLC0415

    mask = loss_mask.reshape(-1).float()
    loss_sum = torch.sum(losses.reshape(-1).float() * mask)
    num_tokens = mask.sum().to(torch.int)
    return loss_sum, num_tokens, {"lm loss": torch.cat([loss_sum.view(1).detach(),
                                                        num_tokens.view(1).float()])}


def check_args(args: Any, config: Any) -> None:
    """Check Megatron-LM's parsed arguments against a polyload config.

    Args:
        args: Megatron's ``get_args()`` namespace (``seq_length``, ``global_batch_size``,
            ``micro_batch_size``, ``seed``, ``train_iters``, ``tensor_model_parallel_size``,
            ``pipeline_model_parallel_size``, ``context_parallel_size``, and, once
            Megatron's ``validate_args`` ran, ``data_parallel_size``); attributes that are
            missing or None are not checked.
        config: a polyload config (path, dict, ``_core.Config``) or a :class:`Loader`.

    Raises:
        ConfigError: a value differs; the message names Megatron's option and polyload's
            key with both values.  Also when ``rampup_batch_size`` is set (polyload's
            ``global_batch_size`` is fixed), ``train_iters`` exceeds ``train_steps``, or
            ``pad_id`` is not below ``padded_vocab_size``.

    Under ``balance: variable_length`` a micro-batch is one packed row of ``max_tokens``
    tokens: Megatron's ``--seq-length`` is ``max_tokens``, ``--micro-batch-size`` 1 and
    ``--global-batch-size`` polyload's ``global_batch_size / micro_batch_size`` (the same
    micro-batches per rank), and ``--calculate-per-token-loss`` must be on.

    Warns (``UserWarning``) when ``eod_mask_loss``, ``reset_position_ids`` or
    ``reset_attention_mask`` is off: polyload's batches always behave as if they were on.
    """
    cfg = config.config if isinstance(config, Loader) else _make_config(config)
    gi = cfg.get_int
    vlen = gi("balance") == BALANCE_VARIABLE_LENGTH
    if vlen:  # one packed row of max_tokens per micro-batch
        pairs = [
            ("--seq-length", "seq_length", "max_tokens", gi("max_tokens")),
            ("--global-batch-size", "global_batch_size",
             "global_batch_size / micro_batch_size",
             gi("global_batch_size") // gi("micro_batch_size")),
            ("--micro-batch-size", "micro_batch_size", "(one row under variable_length)", 1),
        ]
    else:
        pairs = [
            ("--seq-length", "seq_length", "seq_length", gi("seq_length")),
            ("--global-batch-size", "global_batch_size", "global_batch_size",
             gi("global_batch_size")),
            ("--micro-batch-size", "micro_batch_size", "micro_batch_size",
             gi("micro_batch_size")),
        ]
    pairs += [
        ("--seed", "seed", "seed", gi("seed")),
        ("--tensor-model-parallel-size", "tensor_model_parallel_size", "topology.tp",
         gi("topology.tp")),
        ("--pipeline-model-parallel-size", "pipeline_model_parallel_size", "topology.pp",
         gi("topology.pp")),
        ("--context-parallel-size", "context_parallel_size", "topology.cp", gi("topology.cp")),
    ]
    if not gi("topology.dp_auto"):
        pairs.append(("data_parallel_size (world size / (tp*pp*cp))", "data_parallel_size",
                      "topology.dp", gi("topology.dp")))
    problems = []
    for option, attr, key, mine in pairs:
        theirs = getattr(args, attr, None)
        if theirs is not None and int(theirs) != mine:
            problems.append(f"Megatron {option} is {int(theirs)} but polyload {key} is {mine}")
    if vlen and getattr(args, "calculate_per_token_loss", None) is False:
        problems.append("polyload balance: variable_length gives DP ranks unequal token "
                        "counts, so a per-rank mean loss is biased: set Megatron "
                        "--calculate-per-token-loss (and return the micro-batch's loss sum "
                        "and loss_mask sum from loss_func, see per_token_loss)")
    if getattr(args, "rampup_batch_size", None):
        problems.append(f"Megatron --rampup-batch-size {args.rampup_batch_size} is set but "
                        f"polyload's global_batch_size is fixed at {gi('global_batch_size')}")
    vocab = getattr(args, "padded_vocab_size", None)
    if vocab is not None and gi("pad_id") >= int(vocab):
        problems.append(f"polyload pad_id {gi('pad_id')} is outside Megatron's vocabulary "
                        f"(padded_vocab_size {int(vocab)})")
    train_iters = getattr(args, "train_iters", None)
    steps = gi("train_steps")
    if train_iters is not None and steps >= 0 and int(train_iters) > steps:
        problems.append(f"Megatron --train-iters is {int(train_iters)} but polyload "
                        f"train_steps is {steps} (the data would end first)")
    if problems:
        from . import _core  # noqa: PLC0415

        raise ConfigError(_core.ECONFIG, "ECONFIG", "; ".join(problems))
    off = [f"--{flag.replace('_', '-')}" for flag in
           ("eod_mask_loss", "reset_position_ids", "reset_attention_mask")
           if getattr(args, flag, None) is False]
    if off:
        logger.warning("Megatron %s off, but polyload's batches never cross documents",
                       ", ".join(off))
        warnings.warn(
            f"polyload: Megatron {', '.join(off)} off, but polyload's batches never cross "
            "documents: positions restart at 0, attention stays within a document "
            "(THD cu_seqlens) and a document's last token has no loss",
            UserWarning, stacklevel=2)


# ---------------------------------------------------------------- checkpoints

def _iter_dir(root: str, iteration: int) -> str:
    # Megatron-LM's checkpoint directory naming (checkpointing.get_checkpoint_name).
    return os.path.join(root, f"iter_{int(iteration):07d}")


def save_checkpoint_state(iterator: Union[MegatronIterator, Loader], save_dir: str,
                          iteration: int) -> Optional[str]:
    """Write the loader's state next to Megatron's checkpoint of ``iteration``:
    ``<save_dir>/iter_<iteration:07d>/polyload_state.pt`` (``torch.save`` of
    ``{"iteration", "state"}``).  Call it right after Megatron's ``save_checkpoint``.

    The state is the same on every rank, so only global rank 0 writes (when
    torch.distributed is initialized); returns the path written, or None on other ranks.
    """
    import torch.distributed as dist  # noqa: PLC0415

    state = iterator.state_dict()
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return None
    d = _iter_dir(save_dir, iteration)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, STATE_FILE)
    tmp = path + ".tmp"
    torch.save({"iteration": int(iteration), "state": state}, tmp)
    os.replace(tmp, path)
    logger.info("saved the loader state of iteration %d to %s", int(iteration), path)
    return path


def load_checkpoint_state(iterator: Union[MegatronIterator, Loader], load_dir: str,
                          iteration: Optional[int] = None) -> int:
    """Restore the loader's state saved by :func:`save_checkpoint_state`.

    Args:
        iterator: the :class:`MegatronIterator` (or Loader) to restore.
        load_dir: Megatron's ``--load`` directory.
        iteration: the checkpoint's iteration; default: the one in Megatron's tracker file
            ``latest_checkpointed_iteration.txt``, else the largest ``iter_*`` directory
            holding a polyload state.

    Returns the iteration loaded.  Raises FileNotFoundError when there is no state,
    ``StateError`` when it does not fit the config (the message names the field).
    """
    if iteration is None:
        tracker = os.path.join(load_dir, _TRACKER)
        if os.path.exists(tracker):
            with open(tracker) as f:
                text = f.read().strip()
            iteration = int(text) if text.isdigit() else None
        if iteration is None:
            found = [int(n[5:]) for n in os.listdir(load_dir)
                     if n.startswith("iter_") and n[5:].isdigit()
                     and os.path.exists(os.path.join(load_dir, n, STATE_FILE))]
            if not found:
                raise FileNotFoundError(f"polyload: no {STATE_FILE} under {load_dir}")
            iteration = max(found)
    path = os.path.join(_iter_dir(load_dir, iteration), STATE_FILE)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("iteration") != iteration:
        raise ValueError(f"polyload: {path} holds iteration {saved.get('iteration')}, "
                         f"expected {iteration}")
    iterator.load_state_dict(saved["state"])
    logger.info("loaded the loader state of iteration %d from %s", iteration, path)
    return iteration
