"""Image-text sources (type: webdataset) on the real photo corpus of
scripts/make_vlm_corpus.py: the tar index, image sizes from headers, caption tokens,
decoding and resizing against Pillow, Qwen2-VL's smart_resize and patch order against
transformers, multimodal batches, mixing with text, hybrid cost, and bad input."""

import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from PIL import Image

import polyload
from polyload import _core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMG = 300  # image placeholder token (bytes are 0..255)


def _corpus_module():
    spec = importlib.util.spec_from_file_location(
        "make_vlm_corpus", os.path.join(ROOT, "scripts", "make_vlm_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("vlm")
    mod = _corpus_module()
    items = mod.samples()
    mod.write_shards(items, str(out), 8)
    return out, items


def _open(path, mode="fixed", index=-1, caption="", **kw):
    return _core.Source.open_webdataset(str(path), IMG, index=index, mode=mode,
                                        caption=caption, **kw)


def _members(shard):
    with tarfile.open(shard) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers()]


# ------------------------------------------------------------------ index


def test_index_sizes_and_tokens_match_the_tar(corpus):
    out, items = corpus
    src = _open(out / "shard-{000000..000003}.tar")
    assert src.type == "webdataset"
    assert src.num_documents == len(items) == 26
    assert src.num_files == 4
    for i, (key, ext, data, caption, _, _) in enumerate(items):
        info = src.image_info(i)
        w, h = Image.open(io.BytesIO(data)).size
        assert (info["width"], info["height"]) == (w, h), key
        assert info["tokens"] == (336 // 14) ** 2 == 576
        toks = np.asarray(src.read(i))
        cap = np.frombuffer(caption.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        assert (toks[:576] == IMG).all()
        assert np.array_equal(toks[576:], cap), key
        assert src.document_length(i) == 576 + len(cap)


def test_glob_directory_and_brace_agree(corpus):
    out, _ = corpus
    a = _open(out / "shard-{000000..000003}.tar")
    b = _open(out / "*.tar")
    c = _open(out)
    d = _open(out / "shard-{000000,000001,000002,000003}.tar")
    for s in (b, c, d):
        assert s.num_documents == a.num_documents
        assert [s.document_length(i) for i in range(len(s))] == \
            [a.document_length(i) for i in range(len(a))]
    with pytest.raises(polyload.PolyloadIOError, match=r"shard-000004.tar: no such shard"):
        _open(out / "shard-{000000..000009}.tar")


def test_sidecar_written_reused_and_rebuilt(corpus, tmp_path):
    out, _ = corpus
    shard = tmp_path / "s.tar"
    shutil.copy(out / "shard-000000.tar", shard)
    _open(shard, index=-1)
    assert not (tmp_path / "s.tar.plwds").exists()  # in memory only
    s1 = _open(shard, index=0)
    side = tmp_path / "s.tar.plwds"
    assert side.read_bytes()[:8] == b"PLWDS\0\0\0"
    st = side.stat()
    s2 = _open(shard, index=0)
    assert side.stat().st_ino == st.st_ino  # reused, not rewritten
    assert [s2.read(i).tolist() for i in range(len(s2))] == \
        [s1.read(i).tolist() for i in range(len(s1))]
    # Other caption options shape another index: rebuilt.
    s3 = _open(shard, index=0, caption="json:caption")
    assert side.stat().st_ino != st.st_ino
    assert s3.read(0).tolist() == s1.read(0).tolist()  # same caption text
    # A corrupted sidecar is detected by its CRC and rebuilt.
    b = bytearray(side.read_bytes())
    b[-1] ^= 0xFF
    side.write_bytes(bytes(b))
    s4 = _open(shard, index=0)
    assert s4.read(len(s4) - 1).tolist() == s1.read(len(s1) - 1).tolist()


def test_json_token_ids_caption(tmp_path, corpus):
    _, items = corpus
    key, ext, data = items[0][:3]
    shard = tmp_path / "ids.tar"
    with tarfile.open(shard, "w") as t:
        for name, payload in ((f"{key}.{ext}", data),
                              (f"{key}.json", json.dumps({"ids": [5, 7, 151643]}).encode())):
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))
    src = _open(shard, caption="json:ids", eos_id=2)
    assert src.read(0).tolist()[576:] == [5, 7, 151643, 2]


# ------------------------------------------------------------------ pixels


def _pil_fixed(data, size):
    """CLIP/LLaVA preprocessing with Pillow: shorter side to size (bicubic), centre crop."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    s = size / min(w, h)
    nw, nh = max(size, round(w * s)), max(size, round(h * s))
    im = im.resize((nw, nh), Image.BICUBIC)
    x0, y0 = (nw - size) // 2, (nh - size) // 2
    return np.asarray(im.crop((x0, y0, x0 + size, y0 + size))).transpose(2, 0, 1)


def test_fixed_mode_matches_pillow(corpus):
    out, items = corpus
    src = _open(out / "shard-{000000..000003}.tar")
    fmts, means = set(), []
    for i, (key, ext, data, *_rest) in enumerate(items):
        px = np.asarray(src.read_image(i))
        assert px.shape == (3, 336, 336) and px.dtype == np.uint8
        ref = _pil_fixed(data, 336).astype(np.int16)
        diff = np.abs(px.astype(np.int16) - ref)
        # Other bicubic kernels, (JPEG) DCT-domain downscaling, and a centre crop taken
        # in source pixels (up to half a pixel from Pillow's on high-frequency pages).
        assert diff.mean() < 10.0, (key, diff.mean())
        means.append(diff.mean())
        fmts.add(ext)
    assert np.median(means) < 1.0, means
    assert fmts == {"png", "jpg", "webp"}


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for h, w in [(300, 451), (872, 1000), (102, 102), (56, 56), (1411, 1411), (28, 5000),
                 (4000, 3000), (33, 29), (640, 427), (191, 384)]:
        for mn, mx in [(56 * 56, 28 * 28 * 1280), (3136, 200704), (100000, 400000)]:
            want = smart_resize(h, w, factor=28, min_pixels=mn, max_pixels=mx)
            got = _core.smart_resize(h, w, 28, mn, mx)
            assert got == want, (h, w, mn, mx)


def test_native_patches_match_qwen2vl_processor(tmp_path, corpus):
    """An image already at its smart_resize size is not resampled, so our patches must
    equal transformers' Qwen2VLImageProcessor output exactly (temporal copy 0)."""
    from transformers import Qwen2VLImageProcessor

    _, items = corpus
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
    src = _open(shard, mode="native")
    info = src.image_info(0)
    assert (info["out_height"], info["out_width"]) == (280, 448)
    assert info["grid_thw"] == (1, 20, 32) and info["tokens"] == 160
    ours = np.asarray(src.read_image(0))
    proc = Qwen2VLImageProcessor(do_rescale=False, do_normalize=False)
    ref = proc(images=[im], return_tensors="np")
    assert ref["image_grid_thw"].tolist() == [[1, 20, 32]]
    pv = np.asarray(ref["pixel_values"]).reshape(640, 3, 2, 14 * 14)[:, :, 0, :]
    assert ours.shape == (640, 588)
    assert np.array_equal(ours, pv.reshape(640, 588).round().astype(np.uint8))


# ------------------------------------------------------------------ batches


def _flat_text(path, n_docs=200, eos=0):
    rng = np.random.default_rng(0)
    toks = []
    for _ in range(n_docs):
        toks.extend(rng.integers(1, 256, size=int(rng.integers(20, 400))).tolist())
        toks.append(eos)
    np.asarray(toks, dtype=np.uint16).tofile(path)


def _config(out, mode="native", text=None, **kw):
    srcs = [{"name": "img", "type": "webdataset", "path": str(out / "shard-{000000..000003}.tar"),
             "weight": 0.5 if text else 1.0, "index": "memory",
             "image": {"mode": mode, "token_id": IMG, "max_pixels": 200704}}]
    if text:
        srcs.append({"name": "txt", "type": "flat", "path": str(text), "weight": 0.5})
    cfg = {"seed": 3, "seq_length": 2048, "global_batch_size": 4, "micro_batch_size": 2,
           "train_steps": 3, "topology": {"dp": 1}, "threads": 2, "sources": srcs}
    cfg.update(kw)
    return cfg


def test_native_batches_place_every_image(corpus, tmp_path):
    out, _ = corpus
    text = tmp_path / "t.bin"
    _flat_text(text)
    src = _open(out / "shard-{000000..000003}.tar", mode="native", max_pixels=200704)
    n_img = 0
    for b in polyload.Loader(_config(out, text=text), rank=0):
        if "pixel_values" not in b:
            continue
        ids = b["input_ids"].numpy().reshape(-1)
        lab = b["labels"].numpy().reshape(-1)
        grid = b["image_grid_thw"].numpy()
        pos = b["image_positions"].numpy()
        pv = b["pixel_values"].numpy()
        assert pv.dtype == np.uint8 and pv.shape == (int(np.prod(grid, axis=1).sum()), 588)
        assert int((ids == IMG).sum()) == int(pos[:, 1].sum())
        row = 0
        for (t, gh, gw), (at, n) in zip(grid, pos):
            assert t == 1 and n == gh * gw // 4
            assert (ids[at:at + n] == IMG).all()
            assert (lab[at:at + n - 1] == -100).all() and lab[at + n - 1] != IMG
            # The patches are the image of the sample whose run starts here.
            doc = [k for k in range(len(src))
                   if src.image_info(k)["grid_thw"] == (1, gh, gw)]
            blk = pv[row:row + gh * gw]
            assert any(np.array_equal(blk, np.asarray(src.read_image(k))) for k in doc)
            row += gh * gw
            n_img += 1
    assert n_img > 10


def test_fixed_batches_and_visual_tokens_count_as_tokens(corpus, tmp_path):
    out, _ = corpus
    text = tmp_path / "t.bin"
    _flat_text(text, n_docs=2000)
    cfg = _config(out, mode="fixed", text=text, seq_length=4096, train_steps=4)
    loader = polyload.Loader(cfg, rank=0)
    for b in loader:
        if "pixel_values" in b:
            assert tuple(b["pixel_values"].shape[1:]) == (3, 336, 336)
            assert b["pixel_values"].shape[0] == b["image_grid_thw"].shape[0]
            assert (b["image_positions"].numpy()[:, 1] == 576).all()
    st = loader.stats()["sources"]
    # Weights are fractions of tokens, visual tokens included: 50/50 within a draw.
    frac = st["img"]["realized_fraction"]
    assert abs(frac - 0.5) < 0.1, st


def test_plan_reports_backbone_and_encoder_cost(corpus, tmp_path):
    import yaml

    out, _ = corpus
    text = tmp_path / "t.bin"
    _flat_text(text, n_docs=2000)
    cfg = _config(out, text=text, global_batch_size=8, balance="greedy",
                  topology={"dp": 2}, cost={"preset": "causal", "encoder": {"a": 50.0, "b": 1.0}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = os.path.join(ROOT, "build", "polyload")
    if not os.path.exists(cli):
        pytest.skip("C build (make build) not present")
    lines = subprocess.run([cli, "plan", str(path), "--steps", "0:2", "--json"], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    src = _open(out / "shard-{000000..000003}.tar", mode="native", max_pixels=200704)
    assert len(lines) == 4
    for ln in lines:
        r = json.loads(ln)
        enc = 0.0
        for seq in r["sequences"]:
            for name, idx, off, length in seq["chunks"]:
                if name == "img" and off == 0:
                    n = src.image_info(idx)["patches"]
                    enc += 50.0 * n + n * n
        assert r["encoder_cost"] == pytest.approx(enc, rel=1e-9)
        assert r["backbone_cost"] + r["encoder_cost"] == pytest.approx(r["rank_cost"])


def test_config_errors(corpus):
    out, _ = corpus
    bad = _config(out)
    del bad["sources"][0]["image"]
    with pytest.raises(polyload.ConfigError, match="needs 'image'"):
        polyload.Loader(bad, rank=0)
    bad = _config(out)
    bad["sources"][0]["image"].pop("token_id")
    with pytest.raises(polyload.ConfigError, match="token_id"):
        polyload.Loader(bad, rank=0)
    bad = _config(out, mode="fixed")
    bad["sources"][0]["image"]["size"] = 300
    with pytest.raises(polyload.ConfigError, match="multiple of patch_size"):
        polyload.Loader(bad, rank=0)
    bad = _config(out, seq_length=256)  # native max_pixels 200704: up to 256 tokens
    with pytest.raises(polyload.ConfigError, match="256 visual tokens, not fewer than seq_length"):
        polyload.Loader(bad, rank=0)
    bad = _config(out, topology={"dp": 1, "cp": 2})
    with pytest.raises(polyload.ConfigError, match="cp 1"):
        polyload.Loader(bad, rank=0)


# ------------------------------------------------------------------ bad input


def _write_tar(path, members):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, payload in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))


def _jpeg(items):
    return dict((k, d) for k, e, d, *_ in items if e == "jpg")["skimage_rocket"]


def test_truncated_jpeg_names_shard_member_offset(corpus, tmp_path):
    _, items = corpus
    jpg = _jpeg(items)
    shard = tmp_path / "t.tar"
    _write_tar(shard, [("ok.jpg", jpg), ("ok.txt", b"fine"),
                       ("cut.jpg", jpg[: len(jpg) // 2]), ("cut.txt", b"half")])
    src = _open(shard)
    assert len(src) == 2  # the header survives the cut: indexed
    src.read_image(0)
    with pytest.raises(polyload.FormatError) as e:
        src.read_image(1)
    msg = str(e.value)
    assert "t.tar" in msg and "cut.jpg" in msg and "offset" in msg
    assert e.value.name == "EIMAGE"


def test_bad_samples_fail_or_are_skipped_and_counted(corpus, tmp_path):
    _, items = corpus
    jpg = _jpeg(items)
    shard = tmp_path / "bad.tar"
    _write_tar(shard, [
        ("a.jpg", jpg), ("a.txt", b"good"),
        ("b.jpg", b"this is not an image at all, just text" * 4), ("b.txt", b"x"),
        ("c.jpg", jpg),                           # no caption
        ("d.txt", b"no image"),                   # no image
        ("e.jpg", jpg[:40]), ("e.txt", b"header cut"),
        ("f.jpg", jpg), ("f.txt", b"good too"),
    ])
    with pytest.raises(polyload.FormatError, match=r"bad\.tar: member b\.jpg at offset \d+"):
        _open(shard)
    for wanted, pattern in [("b", "not a JPEG"), ("c", "no caption"), ("d", "no image"),
                            ("e", "header truncated")]:
        one = tmp_path / f"only_{wanted}.tar"
        members = [m for m in _members(shard) if m[0].startswith(wanted + ".")]
        _write_tar(one, members)
        with pytest.raises(polyload.FormatError, match=pattern):
            _open(one)
    import yaml

    cfg = _core.Config.parse_string(yaml.safe_dump({
        "on_error": "skip", "global_batch_size": 1,
        "sources": [{"name": "b", "type": "webdataset", "path": str(shard), "index": "memory",
                     "image": {"token_id": IMG}}]}))
    src = cfg.open_source(0)
    assert len(src) == 2 and src.num_skipped == 4
    assert bytes(np.asarray(src.read(1))[576:].astype(np.uint8)) == b"good too"


def test_limit_pixels(corpus, tmp_path):
    _, items = corpus
    shard = tmp_path / "big.tar"
    _write_tar(shard, [("a.jpg", _jpeg(items)), ("a.txt", b"rocket")])
    _open(shard, limit_pixels=640 * 427)
    with pytest.raises(polyload.FormatError, match="exceeds limit_pixels 1000"):
        _open(shard, limit_pixels=1000)
    # A PNG header that promises 60000 x 60000 pixels: refused from the header alone.
    png = bytearray(dict((k, d) for k, e, d, *_ in items if e == "png")["skimage_camera"])
    png[16:24] = (60000).to_bytes(4, "big") + (60000).to_bytes(4, "big")
    _write_tar(shard, [("g.png", bytes(png)), ("g.txt", b"giant")])
    with pytest.raises(polyload.FormatError, match="60000x60000 pixels exceeds"):
        _open(shard)


def test_damaged_tar_checksum_and_size(corpus, tmp_path):
    out, _ = corpus
    good = (out / "shard-000000.tar").read_bytes()
    bad = bytearray(good)
    bad[10] ^= 0x20  # a byte of the first member's name: checksum no longer matches
    p = tmp_path / "sum.tar"
    p.write_bytes(bytes(bad))
    with pytest.raises(polyload.FormatError, match=r"sum\.tar: tar header at offset 0: checksum"):
        _open(p)
    bad = bytearray(good)
    bad[124:136] = b"77777777777\0"  # size far past the end of the file
    chk = sum(bad[:148]) + 8 * 32 + sum(bad[156:512])
    bad[148:156] = b"%06o\0 " % chk
    p = tmp_path / "size.tar"
    p.write_bytes(bytes(bad))
    with pytest.raises(polyload.FormatError, match="size 8589934591 runs past the end"):
        _open(p)
    bad[124:136] = b"12x45\0\0\0\0\0\0\0"
    chk = sum(bad[:148]) + 8 * 32 + sum(bad[156:512])
    bad[148:156] = b"%06o\0 " % chk
    p.write_bytes(bytes(bad))
    with pytest.raises(polyload.FormatError, match="bad size field"):
        _open(p)
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(polyload.FormatError, match="runs past the end|cut by the end"):
        _open(p)


def test_image_probe():
    with pytest.raises(polyload.FormatError):
        _core.image_probe(b"GIF89a" + bytes(40))
    assert _core.image_probe(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\x01\x00\0\0\x00\x80") \
        == (256, 128)


def test_reply_times_each_source(corpus, tmp_path):
    """read_rows_reply with source_ns: the time of each source's reads is
    added to its own counter (a source loader hosting several sources splits its CPU by
    them: an image source's decodes are not charged to the tokens read beside it); the
    reply is the same bytes as without; a bad counter array is refused."""
    import yaml

    out, _ = corpus
    rng = np.random.default_rng(0)
    np.asarray(rng.integers(1, 256, size=20000), dtype=np.uint16).tofile(str(tmp_path / "t.bin"))
    cfg = _core.Config.parse_string(yaml.safe_dump({
        "global_batch_size": 1,
        "sources": [{"name": "img", "type": "webdataset", "index": "memory",
                     "path": str(out / "shard-{000000..000003}.tar"),
                     "image": {"token_id": IMG}},
                    {"name": "txt", "type": "flat", "path": str(tmp_path / "t.bin")}]}))
    img, txt = cfg.open_source(0), cfg.open_source(1)
    srcs = [img, txt]
    n_img = len(img)
    assert n_img >= 20
    # rows alternate: every image (whole run: decoded here) and 200 tokens of text
    rows = []
    for d in range(n_img):
        rows.append([0, d, 0, img.document_length(d)])
        rows.append([1, 0, 200 * d, 200])
    reads = np.asarray(rows, dtype=np.int64)
    ns = np.zeros(2, np.int64)
    reply = _core.read_rows_reply(srcs, reads, ns)
    assert reply == _core.read_rows_reply(srcs, reads)
    assert ns[0] > 0 and ns[1] > 0
    img_tokens = int(reads[reads[:, 0] == 0, 3].sum())
    txt_tokens = int(reads[reads[:, 0] == 1, 3].sum())
    # Decoding and resizing a photo costs orders of magnitude more per token than
    # copying tokens (a split by tokens would make the two equal).
    assert ns[0] / img_tokens > 10 * ns[1] / txt_tokens, (ns, img_tokens, txt_tokens)
    # counters add up over calls; only the sources read are charged
    before = ns.copy()
    _core.read_rows_reply(srcs, reads[reads[:, 0] == 1], ns)
    assert ns[0] == before[0] and ns[1] > before[1]
    for bad in (np.zeros(1, np.int64), np.zeros(2, np.int32), np.zeros(2, np.float64),
                np.zeros(2, np.int64)[::-1].copy().view(np.uint8)):
        with pytest.raises(TypeError, match="source_ns"):
            _core.read_rows_reply(srcs, reads, bad)
    ro = np.zeros(2, np.int64)
    ro.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        _core.read_rows_reply(srcs, reads[reads[:, 0] == 1], ro)
