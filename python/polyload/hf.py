"""Hugging Face transformers integration: packed polyload batches for causal-LM models.

polyload's ``labels`` are shifted (Megatron's convention: ``labels[t]`` is the token after
``input_ids[t]``), while a transformers causal-LM model shifts ``labels`` itself
(``ForCausalLMLoss``: logits at ``t`` are scored against ``labels[t + 1]``).  Passing
polyload's ``labels`` as they are would train each token to predict the one two places
ahead.  :func:`causal_lm_batch` gives the fields a transformers model wants instead:

- ``input_ids``, ``position_ids`` (restarting at 0 in every packed document);
- ``shift_labels``: polyload's labels, already shifted, which ``ForCausalLMLoss`` uses as
  they are when given (exact);
- ``labels``: the unshifted labels (``labels[t + 1] = shift_labels[t]``, -100 at 0), for
  code that reads ``labels``; when a model gets both, its loss uses ``shift_labels``.
  Unshifted labels cannot carry the label of the very last position (it would sit at index
  ``T``), which exists when a long document continues in the next micro-batch: that one
  token's loss is lost with ``labels`` alone, never with ``shift_labels``;
- the FlashAttention varlen keyword arguments ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int32
  offsets of the packed documents) and ``max_length_q``, ``max_length_k`` (int).

Rows are laid end to end as one packed row ``[1, rows * cols]`` (``flatten=True``, the
layout FlashAttention's varlen kernels and polyload's ``cu_seqlens`` use).  How attention
stays within documents depends on ``attn_implementation``:

- ``"flash_attention_2"`` / ``"flash_attention_3"`` (GPU): the ``cu_seq_lens_*`` and
  ``max_length_*`` keyword arguments select the varlen kernels;
- ``"sdpa"`` and ``"eager"`` (also on CPU): transformers builds a block-diagonal causal mask
  from ``position_ids`` when no ``attention_mask`` is given (``masking_utils.
  find_packed_sequence_indices``: a new document starts wherever the position does not
  grow by 1).  That detection is off when an ``attention_mask`` or a KV cache is given,
  and models default to ``use_cache=True``: the returned dict sets ``use_cache=False``;
  do not add an ``attention_mask``.  The FA keyword arguments are ignored there.

Images (webdataset sources).  polyload's sequences hold each image's placeholder token
once per visual token (the expanded layout transformers' vision-language models use), so a
model finds its image features' places from ``input_ids``.  When the batch has images,
:func:`causal_lm_batch` adds ``pixel_values`` as the model's processor would give them,
normalized here, on the batch's device (only uint8 crossed processes):

- native mode (Qwen2-VL, ``Qwen2VLForConditionalGeneration``): ``pixel_values`` float
  ``[n_patches, 3 * temporal_patch_size * p * p]``, each patch repeated over the temporal
  axis as ``Qwen2VLImageProcessor`` does for a still image, and ``image_grid_thw``;
- fixed mode (LLaVA, ``LlavaForConditionalGeneration``): ``pixel_values`` float
  ``[n_images, 3, H, W]``.

The placeholder token must be the model's ``image_token_id`` (the source's
``image.token_id``).

Context parallelism is not supported here (``topology.cp`` must be 1): a CP slice's
positions are not contiguous within a document.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

from . import ConfigError, _core

__all__ = ["causal_lm_batch", "vision_inputs", "check_model", "evaluate"]

IGNORE_INDEX = -100


def vision_inputs(batch: Mapping[str, Any], image_mean=None, image_std=None,
                  temporal_patch_size: int = 2,
                  dtype: torch.dtype = torch.float32) -> Dict[str, Any]:
    """The image keyword arguments of a transformers vision-language model for a polyload
    micro-batch: ``{}`` without images; native mode ``{"pixel_values": [n_patches, 3 *
    temporal_patch_size * p * p], "image_grid_thw": int64 [n_images, 3]}`` (Qwen2-VL's
    processor layout: per patch ``[channel, t, y, x]``, a still image copied over ``t``);
    fixed mode ``{"pixel_values": [n_images, 3, H, W]}``.  Values are ``(x / 255 - mean) /
    std`` (:func:`polyload.torch.normalize_images`; default CLIP's mean and std, as
    Qwen2-VL and LLaVA-1.5 use), in ``dtype``, on the device of ``batch["pixel_values"]``.
    """
    from .torch import CLIP_MEAN, CLIP_STD, normalize_images  # noqa: PLC0415

    pv = batch.get("pixel_values")
    if pv is None:
        return {}
    pv = torch.as_tensor(pv)
    x = normalize_images(pv, CLIP_MEAN if image_mean is None else image_mean,
                         CLIP_STD if image_std is None else image_std, dtype=dtype)
    if x.dim() == 4:
        return {"pixel_values": x}
    t = int(temporal_patch_size)
    x = x.view(x.shape[0], 3, 1, -1).expand(-1, -1, t, -1).reshape(x.shape[0], -1)
    return {"pixel_values": x, "image_grid_thw": torch.as_tensor(batch["image_grid_thw"])}


def causal_lm_batch(batch: Mapping[str, Any], flatten: bool = True,
                    flash_kwargs: bool = True, image_mean=None, image_std=None,
                    temporal_patch_size: int = 2,
                    dp_size: Optional[int] = None) -> Dict[str, Any]:
    """The keyword arguments of a transformers causal-LM forward for one polyload batch.

    Args:
        batch: a polyload micro-batch dict (``input_ids``, ``labels``, ``position_ids``,
            ``cu_seqlens``, ``max_seqlen``; :class:`polyload.Loader` with ``topology.cp``
            1).
        flatten: lay the rows end to end as ``[1, rows * cols]`` (default).  With False
            the shape stays ``[rows, cols]`` (fine for sdpa/eager, whose packed mask works
            per row); the FA keyword arguments are then left out, since they index the
            flattened tokens.
        flash_kwargs: include ``cu_seq_lens_q/k`` and ``max_length_q/k``.
        image_mean, image_std, temporal_patch_size: for batches with images, see
            :func:`vision_inputs` (the model's image processor's values; default CLIP's
            mean and std, temporal patch 2 as Qwen2-VL).
        dp_size: when given, add ``num_items_in_batch`` = the batch's ``step_loss_tokens``
            / ``dp_size``: the model's loss is then the micro-batch's summed token loss
            over the step's loss tokens (times ``dp_size``, which DDP's gradient average
            divides out), so summing the backward of every micro-batch of the step gives
            the gradient of the per-token mean over the whole step, exact when ranks carry
            unequal token counts (``balance: variable_length``).  Pass the data-parallel
            size (1 without DDP); do not divide by the number of micro-batches.  With the
            ``Trainer``, leave it out: ``average_tokens_across_devices=True`` counts the
            same total itself.

    Returns a dict: ``input_ids`` (int64), ``labels`` (unshifted, int64), ``shift_labels``
    (int64, polyload's labels), ``position_ids`` (int64), ``use_cache`` (False), and with
    ``flash_kwargs``
    ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int32 ``[n_segments + 1]``), ``max_length_q``,
    ``max_length_k`` (int); with images also :func:`vision_inputs`'s ``pixel_values`` (and
    ``image_grid_thw`` in native mode).  Call ``model(**causal_lm_batch(batch))``: the loss
    is the mean over the tokens with a label (``ForCausalLMLoss`` with ``shift_labels``);
    image placeholders have none.

    Raises:
        ValueError: the batch lacks a field (a pipeline stage's batch), or its positions
            do not count 0, 1, ... in every segment of ``cu_seqlens`` (a CP slice).
    """
    for f in ("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen"):
        if batch.get(f) is None:
            raise ValueError(f"polyload.hf: the batch has no {f!r} (a pipeline stage's "
                             "batch? transformers models need every field)")
    ids = torch.as_tensor(batch["input_ids"]).long()
    lab = torch.as_tensor(batch["labels"]).long()
    pos = torch.as_tensor(batch["position_ids"]).long()
    cu = torch.as_tensor(batch["cu_seqlens"]).to(torch.int32)
    if int(cu[-1]) != ids.numel():
        raise ValueError("polyload.hf: cu_seqlens do not cover the batch's tokens")
    starts = cu[:-1].long()
    expect = torch.arange(ids.numel()) - torch.repeat_interleave(starts, cu.diff().long())
    if not torch.equal(pos.reshape(-1), expect):
        raise ValueError("polyload.hf: position_ids do not count 0, 1, ... in every segment "
                         "(a context-parallel slice? use topology.cp 1)")
    if flatten:
        ids, lab, pos = ids.reshape(1, -1), lab.reshape(1, -1), pos.reshape(1, -1)
    unshifted = torch.full_like(lab, IGNORE_INDEX)
    unshifted[..., 1:] = lab[..., :-1]
    out: Dict[str, Any] = {
        "input_ids": ids,
        "labels": unshifted,
        "shift_labels": lab,
        "position_ids": pos,
        # With a KV cache, transformers does not look for packed documents in
        # position_ids (masking_utils._preprocess_mask_arguments), and models default to
        # use_cache=True: sdpa/eager attention would then cross documents.
        "use_cache": False,
    }
    if flash_kwargs and flatten:
        max_len = int(batch["max_seqlen"])
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len,
                   max_length_k=max_len)
    out.update(vision_inputs(batch, image_mean, image_std, temporal_patch_size))
    if dp_size is not None:
        n = int(batch.get("step_loss_tokens", -1))
        if n < 0:
            raise ValueError("polyload.hf: the batch does not know its step's loss tokens "
                             "(instruction data or images): count loss_mask over the step "
                             "and all-reduce it instead of dp_size")
        out["num_items_in_batch"] = torch.tensor(max(n, 1) / int(dp_size),
                                                 dtype=torch.float32)
    return out


def check_model(model_or_config: Any, config: Any) -> None:
    """Check a transformers model (or its ``PretrainedConfig``) against a polyload config:
    ``pad_id`` must be inside the model's vocabulary, and so must ``vocab_size`` when
    the config gives one.

    Raises:
        ConfigError: naming both numbers.
    """
    from . import Loader, _make_config  # noqa: PLC0415

    mc = getattr(model_or_config, "config", model_or_config)
    vocab = int(mc.vocab_size)
    cfg = config.config if isinstance(config, Loader) else _make_config(config)
    pad = cfg.get_int("pad_id")
    problems = []
    if pad >= vocab:
        problems.append(f"polyload pad_id {pad} is outside the model's vocabulary "
                        f"(vocab_size {vocab})")
    mine = cfg.get_int("vocab_size")
    if mine > vocab:
        problems.append(f"polyload vocab_size {mine} is larger than the model's "
                        f"vocab_size {vocab}")
    if problems:
        raise ConfigError(_core.ECONFIG, "ECONFIG", "; ".join(problems))


def evaluate(model: Any, batches: Any, source_names: Any = None) -> Dict[str, Any]:
    """The loss of a transformers causal LM over polyload micro-batches, such as a
    validation pass (``loader.eval_iter("valid")`` or :func:`polyload.eval_loader`).

    Runs ``model(**causal_lm_batch(b))`` under ``torch.no_grad()`` for every batch and
    averages the per-token cross-entropy over all tokens with a label (not the mean of
    per-batch means, which would weight a half-empty last batch like a full one).

    Args:
        model: a transformers causal-LM (``LlamaForCausalLM``, ...); its mode is left as
            it is (call ``model.eval()`` for dropout-free numbers).
        batches: an iterable of polyload micro-batch dicts.
        source_names: names for ``segment_sources`` (default: ``batches.source_names``
            when ``batches`` is a Loader); with batches from ``with_sources=True`` the
            result has the loss per source too.

    Returns:
        ``{"loss": float, "tokens": int, "batches": int}`` plus ``"sources": {name:
        {"loss", "tokens"}}`` when the batches carry ``segment_sources``.
    """
    import torch.nn.functional as F  # noqa: PLC0415

    from .torch import loss_by_source  # noqa: PLC0415

    names = source_names if source_names is not None else getattr(batches, "source_names", None)
    total, count, n = 0.0, 0, 0
    per: Dict[str, list] = {}
    with torch.no_grad():
        for b in batches:
            kw = causal_lm_batch(b)
            logits = model(**{k: v for k, v in kw.items()
                              if k not in ("labels", "shift_labels")}).logits
            shift = kw["shift_labels"].reshape(-1)
            tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                  shift.clamp(min=0), reduction="none")
            tok = tok * (shift != IGNORE_INDEX)
            total += float(tok.sum())
            count += int((shift != IGNORE_INDEX).sum())
            n += 1
            if names is not None and "segment_sources" in b:
                shape = torch.as_tensor(b["labels"]).shape
                for name, (ls, lt) in loss_by_source(tok.reshape(shape), b, names).items():
                    acc = per.setdefault(name, [0.0, 0])
                    acc[0] += ls
                    acc[1] += lt
    out: Dict[str, Any] = {"loss": total / count if count else float("nan"),
                           "tokens": count, "batches": n}
    if per:
        out["sources"] = {k: {"loss": v[0] / v[1], "tokens": v[1]} for k, v in per.items()}
    return out

