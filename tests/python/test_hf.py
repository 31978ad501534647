"""polyload.hf with a real (tiny, randomly initialized) transformers LlamaForCausalLM on CPU:
the packed loss equals the loss computed document by document, and attention does not
cross documents (with attn_implementation sdpa and eager, position_ids-based packing)."""

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import polyload  # noqa: E402
from polyload import ConfigError, ConfigWarning  # noqa: E402
from polyload import hf as plhf  # noqa: E402

from conftest import write_megatron, write_vlm_corpus  # noqa: E402

VOCAB = 97
SEQ = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two Megatron sources of random tokens in [2, VOCAB), documents of 1..40 tokens and a
    few longer than seq_length (split across sequences)."""
    d = tmp_path_factory.mktemp("hfdata")
    rng = np.random.default_rng(3)
    prefixes = []
    for s in range(2):
        lens = rng.integers(1, 41, size=60)
        lens[rng.random(60) < 0.05] = rng.integers(SEQ + 1, 2 * SEQ, size=1)
        prefix = str(d / f"src{s}")
        write_megatron(prefix, lens, dtype=np.int32)
        rng.integers(2, VOCAB, size=int(lens.sum()), dtype=np.int32).tofile(prefix + ".bin")
        prefixes.append(prefix)
    return prefixes


def _config(prefixes, **over):
    cfg = {
        "seed": 5, "seq_length": SEQ, "global_batch_size": 4, "micro_batch_size": 2,
        "train_steps": 3, "pad_id": 1, "vocab_size": VOCAB,
        "sources": [{"name": f"s{i}", "type": "megatron", "path": p, "weight": 0.5}
                    for i, p in enumerate(prefixes)],
    }
    cfg.update(over)
    return cfg


def _batches(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        with polyload.Loader(cfg, rank=0) as loader:
            return [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in b.items()}
                    for b in loader]


def _model(attn):
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * SEQ,
        attn_implementation=attn)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    assert model.config._attn_implementation == attn
    return model


def _segments(cu):
    cu = cu.tolist()
    return list(zip(cu[:-1], cu[1:]))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_loss_equals_per_document_reference(data, attn):
    model = _model(attn)
    batches = _batches(_config(data))
    assert len(batches) == 3 * 4 // 2
    n_multi = 0
    for b in batches:
        kw = plhf.causal_lm_batch(b)
        ids, shift, pos = kw["input_ids"], kw["shift_labels"], kw["position_ids"]
        assert ids.shape == (1, 2 * SEQ) and kw["labels"].shape == ids.shape
        # Unshifted labels are polyload's shifted one place right.
        assert torch.equal(kw["labels"][0, 1:], shift[0, :-1])
        assert kw["labels"][0, 0] == -100
        assert kw["cu_seq_lens_q"].dtype == torch.int32
        assert torch.equal(kw["cu_seq_lens_q"], b["cu_seqlens"])
        assert kw["max_length_q"] == kw["max_length_k"] == b["max_seqlen"]
        with torch.no_grad():
            out = model(**kw)
        # Reference: every segment (document, or piece of a long one) on its own.
        total, count = 0.0, 0
        segs = _segments(b["cu_seqlens"])
        n_multi += sum(1 for a, e in segs if e - a > 1) > 2
        for a, e in segs:
            lab = shift[0, a:e]
            if not (lab != -100).any():
                continue
            with torch.no_grad():
                logits = model(input_ids=ids[:, a:e], position_ids=torch.arange(e - a)[None],
                               use_cache=False).logits[0]
            total += torch.nn.functional.cross_entropy(
                logits.double(), lab, ignore_index=-100, reduction="sum").item()
            count += int((lab != -100).sum())
        assert count == int((shift != -100).sum()) > 0
        # ForCausalLMLoss computes in float32 (logits.float()): agreement to its precision.
        assert out.loss.item() == pytest.approx(total / count, rel=1e-6)
        # Without the packing information the model attends across documents: the loss
        # differs, so the comparison above can fail.
        with torch.no_grad():
            crossed = model(input_ids=ids, labels=kw["labels"], shift_labels=shift,
                            use_cache=False).loss
        assert abs(crossed.item() - total / count) > 1e-5  # 100x the agreement above
    assert n_multi > 0  # several documents were packed together


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_does_not_cross_documents(data, attn):
    model = _model(attn)
    b = _batches(_config(data))[0]
    kw = plhf.causal_lm_batch(b, flash_kwargs=False)
    segs = [(a, e) for a, e in _segments(b["cu_seqlens"]) if e - a > 1]
    assert len(segs) >= 3
    with torch.no_grad():
        ref = model(**kw).logits[0]
    rng = np.random.default_rng(0)
    for a, e in segs[:4]:
        changed = dict(kw)
        ids = kw["input_ids"].clone()
        ids[0, a:e] = torch.from_numpy(rng.integers(2, VOCAB, size=e - a))
        changed["input_ids"] = ids
        with torch.no_grad():
            got = model(**changed).logits[0]
        outside = torch.ones(ids.shape[1], dtype=torch.bool)
        outside[a:e] = False
        torch.testing.assert_close(got[outside], ref[outside], rtol=0, atol=1e-12)
        assert not torch.allclose(got[a:e], ref[a:e])


def test_unflattened_rows_and_errors(data):
    model = _model("sdpa")
    b = _batches(_config(data))[1]
    flat = plhf.causal_lm_batch(b)
    rows = plhf.causal_lm_batch(b, flatten=False)
    assert rows["input_ids"].shape == (2, SEQ) and "cu_seq_lens_q" not in rows
    with torch.no_grad():
        lf = model(**flat).loss
        lr = model(**rows).loss
    # Rows kept apart give the same loss (the packed mask works per row, and
    # shift_labels carry every label).
    assert lf.item() == pytest.approx(lr.item(), rel=1e-6)
    missing = dict(b)
    del missing["labels"]
    with pytest.raises(ValueError, match="no 'labels'"):
        plhf.causal_lm_batch(missing)
    bad = dict(b)
    bad["position_ids"] = torch.arange(2 * SEQ).reshape(2, SEQ)
    with pytest.raises(ValueError, match="do not count 0, 1"):
        plhf.causal_lm_batch(bad)


def test_check_model(data):
    model = _model("sdpa")
    plhf.check_model(model, _config(data))
    with pytest.raises(ConfigError, match=r"pad_id 97 is outside the model's vocabulary "
                                          r"\(vocab_size 97\)"):
        cfg = _config(data, pad_id=97)
        del cfg["vocab_size"]
        plhf.check_model(model, cfg)
    with pytest.raises(ConfigError, match="vocab_size 200 is larger than the model's "
                                          "vocab_size 97"):
        plhf.check_model(model.config, _config(data, vocab_size=200))


def test_evaluate_a_validation_pass(data):
    """polyload.hf.evaluate over Loader.eval_iter: the token-weighted loss of the pass
    equals the model's own loss summed batch by batch, and its per-source losses add up to
    it (batches with segment_sources)."""
    model = _model("sdpa")
    cfg = _config(data, split="6,2,2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        loader = polyload.Loader(cfg, rank=0, with_sources=True)
    with loader, loader.eval_iter("valid") as ev:
        got = plhf.evaluate(model, ev)
    total, count = 0.0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        with polyload.eval_loader(cfg, "valid", rank=0) as ev2:
            for b in ev2:
                kw = plhf.causal_lm_batch(b)
                n = int((kw["shift_labels"] != -100).sum())
                if n == 0:  # an all-padding micro-batch at the pass's end: its mean is NaN
                    continue
                with torch.no_grad():
                    total += float(model(**kw).loss) * n
                count += n
    assert got["tokens"] == count > 0 and got["batches"] >= 1
    # transformers computes its loss in float32 (ForCausalLMLoss upcasts to float)
    assert got["loss"] == pytest.approx(total / count, rel=1e-6)
    src = got["sources"]
    assert set(src) == {"s0", "s1"} and sum(v["tokens"] for v in src.values()) == count
    assert sum(v["loss"] * v["tokens"] for v in src.values()) / count == pytest.approx(
        got["loss"], rel=1e-9)


# ------------------------------------------------------------------ images


IMG = 300  # the image placeholder token (caption bytes are 0..255)


def _one_image_shard(tmp_path, items):
    """One photo already at its smart_resize size (not resampled), as a shard."""
    import io
    import tarfile

    from PIL import Image

    data = dict((k, d) for k, _, d, *_ in items)["skimage_chelsea"]
    im = Image.open(io.BytesIO(data)).convert("RGB").crop((0, 0, 448, 280))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    shard = tmp_path / "one.tar"
    with tarfile.open(shard, "w") as t:
        for name, payload in (("cat.png", buf.getvalue()), ("cat.txt", b"a cat")):
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))
    return shard, im


def _img_config(path, mode, **over):
    cfg = {"seed": 1, "seq_length": 1024, "global_batch_size": 2, "micro_batch_size": 1,
           "train_steps": 2, "sources": [
               {"name": "img", "type": "webdataset", "path": str(path), "index": "memory",
                "weight": 1.0, "image": {"mode": mode, "token_id": IMG, "max_pixels": 125440}}]}
    cfg.update(over)
    return cfg


def test_vision_inputs_match_the_processors(tmp_path):
    """causal_lm_batch's pixel_values are what transformers' Qwen2VLImageProcessor (native
    mode) and CLIPImageProcessor (fixed mode, LLaVA) give for the same pixels: rescaled,
    normalized with CLIP's mean/std, Qwen2-VL's temporal copy; image_grid_thw equal."""
    items = write_vlm_corpus(tmp_path / "vlm")
    shard, im = _one_image_shard(tmp_path, items)
    b = _batches(_img_config(shard, "native", seq_length=300))[0]  # one sample a row
    kw = plhf.causal_lm_batch(b)
    ref = transformers.Qwen2VLImageProcessorPil()(images=[im], return_tensors="pt")
    assert kw["image_grid_thw"].tolist() == ref["image_grid_thw"].tolist() == [[1, 20, 32]]
    assert kw["pixel_values"].shape == ref["pixel_values"].shape == (640, 1176)
    torch.testing.assert_close(kw["pixel_values"], ref["pixel_values"].float(), atol=2e-6,
                               rtol=0)
    # Fixed mode: the same uint8 pixels through CLIP's normalization (no resize there).
    b = _batches(_img_config(shard, "fixed", seq_length=1024))[0]
    kw = plhf.causal_lm_batch(b)
    assert "image_grid_thw" not in kw and kw["pixel_values"].shape == (1, 3, 336, 336)
    u8 = b["pixel_values"].permute(0, 2, 3, 1).numpy()
    clip = transformers.CLIPImageProcessorPil(do_resize=False, do_center_crop=False)
    ref = clip(images=list(u8), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(kw["pixel_values"], ref.float(), atol=2e-6, rtol=0)


def test_qwen2vl_trains_on_packed_image_batches(tmp_path):
    """A real (tiny, random) Qwen2VLForConditionalGeneration consumes causal_lm_batch of
    packed image-text micro-batches: every image's features land on its placeholder run
    (the model checks the count), the loss equals cross-entropy on polyload's shifted
    labels, and a backward step reaches the vision tower."""
    import torch.nn.functional as F

    write_vlm_corpus(tmp_path / "vlm")
    cfg = _img_config(tmp_path / "vlm" / "shard-{000000..000003}.tar", "native",
                      seq_length=512, global_batch_size=4, micro_batch_size=2, train_steps=2)
    cfg["sources"][0]["image"]["max_pixels"] = 28 * 28 * 16
    mc = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=320, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=301, vision_start_token_id=302,
        vision_end_token_id=303, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(mc)
    n_img = 0
    for b in _batches(cfg):
        kw = plhf.causal_lm_batch(b, flash_kwargs=False)
        assert "pixel_values" in kw
        n_img += len(kw["image_grid_thw"])
        assert int((kw["input_ids"] == IMG).sum()) == int(kw["image_grid_thw"].prod(1).sum()) // 4
        model.zero_grad()
        out = model(**kw)
        want = F.cross_entropy(out.logits.reshape(-1, 320).float(),
                               kw["shift_labels"].reshape(-1), ignore_index=-100)
        torch.testing.assert_close(out.loss, want)
        out.loss.backward()
        g = model.model.visual.patch_embed.proj.weight.grad
        assert g is not None and float(g.abs().sum()) > 0
    assert n_img >= 4
