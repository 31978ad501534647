"""PyTorch helpers for polyload.

``broadcast_tp`` is the Megatron pattern for tensor-parallel (TP) groups (as
``megatron.training.utils.get_batch_on_this_tp_rank``): only the first rank of each TP
group runs a :class:`polyload.Loader`; it broadcasts every micro-batch to its TP peers,
which need the same data (SPEC section 2).  This saves the peers' reads and memory; the
Ray deployment's constructors do the same across processes without a trainer group.
Micro-batches with images carry their image fields too (:data:`IMAGE_FIELDS`, uint8 pixels:
``normalize_images`` turns them into model inputs on the device).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

__all__ = ["broadcast_tp", "BATCH_FIELDS", "IMAGE_FIELDS", "CLIP_MEAN", "CLIP_STD",
           "normalize_images", "token_sources", "loss_by_source", "per_token_loss",
           "trim_padding"]

#: The tensor fields of a micro-batch, in the order they are broadcast (SPEC section 3;
#: ``segment_sources`` with ``Loader(..., with_sources=True)``).
BATCH_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens",
                "segment_sources")
#: The image fields of a micro-batch with images (webdataset sources), broadcast after
#: BATCH_FIELDS when present: ``pixel_values`` uint8 (fixed mode ``[n_images, 3, H, W]``,
#: native mode ``[n_patches, 3 * p * p]``), ``image_grid_thw`` and ``image_positions``
#: int64 ``[n_images, 3]`` / ``[n_images, 2]``.
IMAGE_FIELDS = ("pixel_values", "image_grid_thw", "image_positions")
_FIELDS = BATCH_FIELDS + IMAGE_FIELDS
_MAX_DIM = 4
#: The int fields of a micro-batch, carried in the header.
_SCALARS = ("max_seqlen", "step", "micro_batch", "step_loss_tokens", "rank_loss_tokens",
            "non_padding_tokens")

# dtype codes of the header (any value fits: they only need to agree between ranks)
_DTYPES = (torch.int64, torch.int32, torch.float32, torch.float64, torch.int16,
           torch.uint8, torch.int8, torch.bfloat16, torch.float16)
_SLOT = 3 + _MAX_DIM  # per field: present, dtype code, ndim, dim0 .. dim3
_HEADER = len(_FIELDS) * _SLOT + 2 * len(_SCALARS)  # + (present, value) per int


def _default_device(group) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_tp(
    batch: Optional[Dict[str, Any]],
    group: Optional["dist.ProcessGroup"] = None,
    device: Optional[torch.device] = None,
) -> Dict[str, Any]:
    """Broadcast one micro-batch from the first rank of a TP group to the others.

    Args:
        batch: on group rank 0, a micro-batch dict from :class:`polyload.Loader`
            (``input_ids``, ``labels``, ``loss_mask``, ``position_ids``: ``[micro_batch,
            seq_length / cp]``; ``cu_seqlens``: int32 ``[n_segments + 1]``;
            ``max_seqlen``: int; with ``with_sources=True`` also ``segment_sources``,
            ``step`` and ``micro_batch``; in micro-batches with images also
            :data:`IMAGE_FIELDS` (``pixel_values`` uint8, fixed mode 4-D); absent fields
            stay absent).  ``None`` on the other ranks (ignored there).
        group: the TP process group (``None``: the default group).  The source is the
            group's rank 0 (``dist.get_global_rank(group, 0)``).
        device: where tensors are sent and received.  Default: the current CUDA device
            for an NCCL group, else the CPU.

    Returns:
        The same micro-batch on every rank of the group, tensors on ``device``, with
        shapes and dtypes as sent.  On group rank 0 the tensors are ``batch``'s own
        (moved to ``device`` if needed).

    Shapes go first (one int64 header of fixed size), then each tensor, so receivers
    allocate exactly.  All ranks of ``group`` must call it with the same ``group``.

    Raises:
        ValueError: group rank 0 passed ``None``, or a field has more than 4 dimensions.
    """
    if device is None:
        device = _default_device(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    me = dist.get_rank(group)
    header = torch.zeros(_HEADER, dtype=torch.int64)
    if me == 0:
        if batch is None:
            raise ValueError("broadcast_tp: group rank 0 must pass a batch")
        tensors = {}
        for i, name in enumerate(_FIELDS):
            t = batch.get(name)
            if t is None:
                continue
            t = torch.as_tensor(t)
            if t.dim() > _MAX_DIM:
                raise ValueError(f"broadcast_tp: {name} has {t.dim()} dimensions "
                                 f"(at most {_MAX_DIM})")
            tensors[name] = t.to(device, non_blocking=True).contiguous()
            shape = list(t.shape) + [0] * (_MAX_DIM - t.dim())
            header[i * _SLOT: (i + 1) * _SLOT] = torch.tensor(
                [1, _DTYPES.index(t.dtype), t.dim()] + shape)
        base = len(_FIELDS) * _SLOT
        for j, name in enumerate(_SCALARS):
            if batch.get(name) is not None:
                header[base + 2 * j] = 1
                header[base + 2 * j + 1] = int(batch[name])
    header = header.to(device)
    dist.broadcast(header, src=src, group=group)
    h = header.cpu().tolist()
    out: Dict[str, Any] = {}
    for i, name in enumerate(_FIELDS):
        present, code, ndim, *dims = h[i * _SLOT: (i + 1) * _SLOT]
        if not present:
            continue
        if me == 0:
            t = tensors[name]
        else:
            t = torch.empty(dims[:ndim], dtype=_DTYPES[code], device=device)
        dist.broadcast(t, src=src, group=group)
        out[name] = t
    base = len(_FIELDS) * _SLOT
    for j, name in enumerate(_SCALARS):
        if h[base + 2 * j]:
            out[name] = int(h[base + 2 * j + 1])
    return out


#: CLIP's (and Qwen2-VL's, LLaVA's) per-channel mean and std of RGB in [0, 1].
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def normalize_images(pixel_values: torch.Tensor, mean=CLIP_MEAN, std=CLIP_STD,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(pixel_values / 255 - mean) / std`` per channel, on the tensor's device (where
    polyload leaves normalization, so only uint8 crosses processes and PCIe).

    Args:
        pixel_values: uint8 ``[n_images, 3, H, W]`` (fixed mode) or ``[n_patches, 3 * p *
            p]`` (native mode, each row channel-major: ``[3, p, p]``).
        mean, std: per-channel values for RGB in [0, 1] (default CLIP's, which Qwen2-VL and
            LLaVA use).
        dtype: of the result.

    Returns:
        A ``dtype`` tensor of the same shape, as transformers' image processors compute
        with ``do_rescale`` and ``do_normalize`` (rescale by 1/255, then normalize).
    """
    x = pixel_values.to(dtype) * (1.0 / 255.0)
    m = torch.as_tensor(mean, dtype=dtype, device=x.device)
    s = torch.as_tensor(std, dtype=dtype, device=x.device)
    if x.dim() == 4:
        return (x - m[None, :, None, None]) / s[None, :, None, None]
    if x.dim() == 2 and x.shape[1] % 3 == 0:
        y = x.view(x.shape[0], 3, -1)
        return ((y - m[None, :, None]) / s[None, :, None]).view_as(x)
    raise ValueError(f"normalize_images: pixel_values of shape {tuple(x.shape)} are neither "
                     "[n, 3, H, W] nor [n_patches, 3 * p * p]")


def token_sources(batch: Dict[str, Any]) -> torch.Tensor:
    """The source of every token of a micro-batch from ``Loader(..., with_sources=True)``:
    an int64 tensor shaped like ``input_ids`` (``[rows, cols]``), holding the index into
    ``loader.source_names`` of the token's segment, -1 on a row's trailing padding.
    Built from ``cu_seqlens`` and ``segment_sources`` (one ``repeat_interleave``).

    Raises:
        KeyError: the batch has no ``segment_sources`` (the Loader was created without
            ``with_sources=True``, or the rank receives no ``cu_seqlens``).
    """
    seg = batch["segment_sources"].to(torch.int64)
    cu = batch["cu_seqlens"].to(torch.int64)
    per_token = torch.repeat_interleave(seg, cu[1:] - cu[:-1])
    shape = (batch["labels"] if "labels" in batch else batch["input_ids"]).shape
    return per_token.reshape(shape)


def loss_by_source(token_loss: torch.Tensor, batch: Dict[str, Any],
                   source_names) -> Dict[str, Any]:
    """Sum the per-token loss of a micro-batch by source, for logging.

    Args:
        token_loss: ``[rows, cols]`` float, the loss of each token (e.g.
            ``cross_entropy(..., reduction="none")`` against ``labels``); only tokens with
            ``loss_mask`` 1 count.
        batch: the micro-batch dict (``with_sources=True``), with ``loss_mask``.
        source_names: ``loader.source_names``.

    Returns:
        ``{name: (loss_sum, tokens)}`` for the sources present in the batch, as Python
        floats and ints; divide to log a mean, or add up over steps and ranks first.
    """
    src = token_sources(batch).reshape(-1)
    mask = batch["loss_mask"].reshape(-1) > 0
    loss = token_loss.detach().reshape(-1).to(torch.float64)
    out = {}
    for k in torch.unique(src[mask]).tolist():
        sel = mask & (src == k)
        out[source_names[k]] = (float(loss[sel].sum()), int(sel.sum()))
    return out


def per_token_loss(token_loss: torch.Tensor, batch: Dict[str, Any], dp_size: int = 1) -> torch.Tensor:
    """The micro-batch's share of the step's per-token mean loss, for ``backward()``.

    ``(token_loss * loss_mask).sum() * dp_size / step_loss_tokens``: summing the backward
    of every micro-batch of a step (no division by the number of micro-batches) and
    averaging over DP ranks (DDP's gradient all-reduce, hence the ``dp_size`` factor)
    gives the gradient of the mean loss over all the step's loss tokens.  It stays exact
    when DP ranks carry unequal token counts (``balance: variable_length``), where the
    mean of per-rank means does not.

    Args:
        token_loss: per-token losses (``reduction="none"``), as many elements as the
            batch's ``loss_mask``.
        batch: the polyload micro-batch dict (``loss_mask``, ``step_loss_tokens``).
        dp_size: the data-parallel size over which gradients are averaged (1 when they
            are summed, or without DDP).

    Raises:
        ValueError: the batch does not know its step's count (``step_loss_tokens`` -1:
            instruction data or images, whose masks depend on the tokens); count
            ``loss_mask`` over the step's micro-batches and all-reduce it instead.
    """
    n = int(batch.get("step_loss_tokens", -1))
    if n < 0:
        raise ValueError("polyload: the batch does not know its step's loss tokens "
                         "(instruction data or images): count loss_mask over the step and "
                         "all-reduce it")
    mask = torch.as_tensor(batch["loss_mask"]).to(token_loss.device).reshape(-1)
    return (token_loss.reshape(-1) * mask).sum() * (dp_size / max(n, 1))


def trim_padding(batch: Dict[str, Any]) -> Dict[str, Any]:
    """The micro-batch without its row's trailing padding (one row, ``topology.cp`` 1).

    Under ``balance: variable_length`` a micro-batch is one packed row of ``max_tokens``
    tokens whose documents fill it only in part; the rest is a padding segment of
    ``cu_seqlens``.  A THD model computes that segment too (its attention costs like a
    document of that length), which gives back part of what balancing gained.  This
    returns a dict whose token fields are cut to the first ``non_padding_tokens`` tokens
    (views, no copy), ``cu_seqlens`` without the padding segment, and ``max_seqlen`` of
    what is left.  Other keys are kept.  A batch without padding is returned as is.

    Raises:
        ValueError: more than one row, or no ``non_padding_tokens`` (a batch without
            ``input_ids``).
    """
    n = batch.get("non_padding_tokens")
    if n is None:
        raise ValueError("polyload: trim_padding needs the batch's non_padding_tokens "
                         "(the first pipeline stage's batch)")
    ids = batch.get("input_ids")
    if ids is not None and ids.shape[0] != 1:
        raise ValueError(f"polyload: trim_padding works on one packed row, not {ids.shape[0]} "
                         "(balance: variable_length gives one)")
    cu = batch["cu_seqlens"]
    if int(cu[-1]) <= n:
        return batch
    out = dict(batch)
    for k in ("input_ids", "labels", "loss_mask", "position_ids"):
        if batch.get(k) is not None:
            out[k] = batch[k][:, :n]
    keep = cu[cu <= n]
    out["cu_seqlens"] = keep
    if "segment_sources" in batch and batch["segment_sources"] is not None:
        out["segment_sources"] = batch["segment_sources"][:len(keep) - 1]
    out["max_seqlen"] = int(keep.diff().max()) if len(keep) > 1 else 0
    return out