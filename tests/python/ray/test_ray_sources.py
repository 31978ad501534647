"""Every source type through a deployment: raw text tokenized in the source loaders,
parquet and tiktoken sources, image-text sources decoded and resized in the source loaders
(native and fixed), a damaged image, per-source CPU of a shared loader, and instruction
data."""

import json
import os

import numpy as np
import pytest

import polyload

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pr = pytest.importorskip("polyload.ray")

from conftest import batch_hash, write_vlm_corpus  # noqa: E402
from ray_helpers import NS, loader_hashes, PLACEMENT, _lockstep  # noqa: E402


def test_raw_text_tokenized_in_source_loaders(cluster, tmp_path_factory):
    """Raw jsonl sources in the deployment: the source loaders tokenize (the planner holds
    lengths only, asked of them), and the batches equal the embedded loader's and so those
    of the same text prepared offline."""
    import fortunes_corpus as fc

    corpus = fc.build(tmp_path_factory.mktemp("ray_fortunes"))
    cfg = fc.config(corpus, train_steps=8, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [
        {"name": n, "type": "jsonl", "path": os.path.join(corpus["dir"], f"{n}.jsonl"),
         "weight": w} for n, w in (("tech", 0.6), ("wit", 0.4))]
    with pr.launch(cfg, num_source_loaders={"tech": 2, "wit": 1}, num_constructors=1,
                   namespace=NS, name="rawtext") as dep:
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="rawtext") for r in (0, 1)]
        got = {0: [], 1: []}
        while True:
            b = [c.next_batch() for c in clients]
            if b[0] is None:
                break
            for r in (0, 1):
                got[r].append(batch_hash(b[r]))
        counts = ray.get([a.num_tokenized.remote() for a in dep.actors["source_loader"]])
        profs = ray.get([a.profile.remote() for a in dep.actors["source_loader"]])
        toks = ray.get([a.tokenizers.remote() for a in dep.actors["source_loader"]])
        standby = ray.get([a.tokenizers.remote() for a in dep.actors["shadow"]])
    prepared = fc.config(corpus, train_steps=8)
    for r in (0, 1):
        assert got[r] == loader_hashes(cfg, r)[0] == loader_hashes(prepared, r)[0], r
    # The cost profile's tokenizing CPU, per source, measured in C: some wherever the
    # source's documents were tokenized, and within the process's CPU
    served = [p for p in profs if any(v["tokenized"] for v in p["sources"].values())]
    assert served
    for p in served:
        for v in p["sources"].values():
            assert v["tokenize_cpu_s"] > 0 or not v["tokenized"], p
        assert sum(v["tokenize_cpu_s"] for v in p["sources"].values()) <= p["cpu_s"] + 0.05
    # One top-level tokenizer: each actor loaded it once for every source it holds; the
    # standbys hold none loaded (they never took over).
    for held in toks:
        assert held and all(t["loaded"] and t["loads"] == 1 and t["shared_by"] == len(held)
                            for t in held.values()), held
    assert standby and all(t == {"loaded": False, "loads": 1, "shared_by": 0}
                           for held in standby for t in held.values()), standby
    tokenized = sum(sum(c.values()) for c in counts)
    # 8 steps x 8 sequences x 128 tokens of short fortunes: a few hundred documents, each
    # tokenized once by the loader that owns it (plus the planner's lookahead window).
    assert 0 < tokenized <= 2 * 512 + 400


def test_parquet_and_tiktoken_sources_in_source_loaders(cluster, tmp_path_factory):
    """A parquet source (Arrow's reader in the source loader actors) and a jsonl source
    tokenized by tiktoken (a .tiktoken file made from the corpus' tokenizer.json) in the
    deployment: the batches equal the embedded loader's and those of the same text
    prepared offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import fortunes_corpus as fc
    from polyload._tiktoken import tokenizer_json_to_tiktoken

    corpus = fc.build(tmp_path_factory.mktemp("ray_fortunes_pq"))
    d = tmp_path_factory.mktemp("ray_parquet")
    with open(os.path.join(corpus["dir"], "tech.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    pq.write_table(pa.table({"text": texts}), str(d / "tech.parquet"), row_group_size=128)
    tokenizer_json_to_tiktoken(corpus["tokenizer"], str(d / "f.tiktoken"))
    cfg = fc.config(corpus, train_steps=8, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [
        {"name": "tech", "type": "parquet", "path": str(d / "tech.parquet"), "weight": 0.6},
        {"name": "wit", "type": "jsonl", "path": os.path.join(corpus["dir"], "wit.jsonl"),
         "weight": 0.4, "eos_id": 0,
         "tokenizer": {"type": "tiktoken", "path": str(d / "f.tiktoken"),
                       "pat_str": "r50k_base"}}]
    with pr.launch(cfg, num_source_loaders={"tech": 2, "wit": 1}, num_constructors=1,
                   namespace=NS, name="rawpq") as dep:
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="rawpq") for r in (0, 1)]
        got = _lockstep(clients)
        counts = ray.get([a.num_tokenized.remote() for a in dep.actors["source_loader"]])
    prepared = fc.config(corpus, train_steps=8)
    for r in (0, 1):
        assert got[r] == loader_hashes(cfg, r)[0] == loader_hashes(prepared, r)[0], r
    assert sum(sum(c.values()) for c in counts) > 0


def _vlm_corpus(out):
    """The real photo corpus of scripts/make_vlm_corpus.py (26 samples, 4 shards) and a flat
    text source, in `out`."""
    import io
    import tarfile

    items = write_vlm_corpus(out)
    rng = np.random.default_rng(0)
    toks = []
    for _ in range(400):
        toks.extend(rng.integers(1, 256, size=int(rng.integers(20, 400))).tolist())
        toks.append(0)
    np.asarray(toks, dtype=np.uint16).tofile(str(out / "t.bin"))
    # A shard whose second photo is cut in half: its header survives (indexed), its
    # pixels do not decode.
    jpg = next(d for k, e, d, *_ in items if e == "jpg")
    with tarfile.open(str(out / "cut.tar"), "w", format=tarfile.USTAR_FORMAT) as t:
        for name, payload in [("a.jpg", jpg), ("a.txt", b"a whole photo"),
                              ("b.jpg", jpg[: len(jpg) // 2]), ("b.txt", b"half a photo")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))
    return items


def _vlm_config(mode, img="shard-{000000..000003}.tar", **kw):
    """Relative paths: the actors resolve them against launch's directory; a trainer
    process that stands elsewhere has no copy of the photos."""
    cfg = {"seed": 3, "seq_length": 2048 if mode == "native" else 4096,
           "global_batch_size": 8, "micro_batch_size": 2, "train_steps": 4,
           "topology": {"dp": 2, "tp": 2}, "threads": 2,
           "sources": [{"name": "img", "type": "webdataset", "path": img, "weight": 0.5,
                        "index": "memory",
                        "image": {"mode": mode, "token_id": 300, "max_pixels": 200704}},
                       {"name": "txt", "type": "flat", "path": "t.bin", "weight": 0.5}]}
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ray_vlm")
    _vlm_corpus(out)
    return out


@pytest.mark.parametrize("mode", ["native", "fixed"])
def test_images_through_the_deployment(cluster, vlm_dir, tmp_path, monkeypatch, mode):
    """Image-text sources in the deployment: the source loaders (on the loader node) decode
    and resize, the constructors put pixels into packages, and every rank of dp 2 x tp 2
    gets the embedded loader's micro-batches, pixel_values, image_grid_thw and
    image_positions included (hashes over every field), in a process without the photos."""
    monkeypatch.chdir(vlm_dir)
    cfg = _vlm_config(mode)
    want, n_img, px_bytes = {}, 0, 0
    for r in range(4):
        with polyload.Loader(cfg, rank=r) as loader:
            batches = list(loader)
            if r == 0:
                want_stats = loader.stats()
        want[r] = [batch_hash(b) for b in batches]
        n_img += sum(int(b["image_grid_thw"].shape[0]) for b in batches if "pixel_values" in b)
        px_bytes += sum(b["pixel_values"].numel() for b in batches if "pixel_values" in b)
    assert n_img > 20
    with pr.launch(cfg, num_source_loaders={"img": 2, "txt": 1}, num_constructors=2,
                   namespace=NS, name=f"vlm_{mode}", placement=PLACEMENT) as dep:
        assert dep.info["nodes"]["source_loader"] == [cluster.node_ids["loader_node"]] * 3
        empty = tmp_path / "trainer_cwd"
        empty.mkdir()
        monkeypatch.chdir(empty)  # the photos are not reachable from here
        clients = [pr.Client(cfg, rank=r, namespace=NS, name=f"vlm_{mode}") for r in range(4)]
        got = {r: [] for r in range(4)}
        while True:
            bs = [c.next_batch() for c in clients]
            if bs[0] is None:
                assert all(b is None for b in bs)
                break
            for r, b in enumerate(bs):
                got[r].append(batch_hash(b))
        pixels = sum(c.package_bytes for c in clients)
        st = clients[0].stats()  # visual tokens count as tokens in both deployments
        for key in ("steps", "tokens", "padding_fraction", "sources"):
            assert st[key] == want_stats[key], key
        for c in clients:
            c.close()
    for r in range(4):
        assert got[r] == want[r], f"rank {r}"
    # The pixels crossed the object store: each rank's packages held its batches' pixels.
    assert pixels > px_bytes


def test_shared_loader_charges_each_source_its_own_cpu(cluster, vlm_dir, monkeypatch):
    """One source loader serving an image source and a token source splits the CPU of
    its reads by the time C measured for each source, not by their tokens: the photos'
    decoding is charged to the image source (before, both got the same CPU per token,
    and the autoscaler had to guess the split from calibrations)."""
    monkeypatch.chdir(vlm_dir)
    cfg = _vlm_config("fixed", topology={"dp": 1}, global_batch_size=4, train_steps=6)
    with pr.launch(cfg, max_source_loader_actors=1, shadows=0, namespace=NS,
                   name="vlm_split") as dep:
        with pr.Client(cfg, rank=0, namespace=NS, name="vlm_split") as c:
            n = sum(1 for _ in c)
        assert n == 6 * 2  # 6 steps of 2 micro-batches
        slots = dep.scaling()["slots"]
        assert len(slots) == 1
        prof = ray.get(ray.get_actor(slots[0]["actors"][0], namespace=NS).profile.remote())
    assert prof["read_split"] == "time"
    img, txt = prof["sources"][0], prof["sources"][1]
    assert img["tokens"] > 0 and txt["tokens"] > 0
    per_img, per_txt = img["read_cpu_s"] / img["tokens"], txt["read_cpu_s"] / txt["tokens"]
    # a decoded, resized photo costs orders of magnitude more per token than copied tokens
    assert per_img > 10 * per_txt, prof
    assert img["read_cpu_s"] + txt["read_cpu_s"] == pytest.approx(prof["read_cpu_s"], rel=1e-6)


def test_damaged_image_in_the_deployment(cluster, vlm_dir, monkeypatch):
    """A photo that does not decode fails, in the deployment, the same micro-batch as in
    the embedded loader, with the same exception type and message (shard, member, offset):
    the source loader ships the error in its reply instead of failing the whole read."""
    monkeypatch.chdir(vlm_dir)
    cfg = _vlm_config("fixed", img="cut.tar", topology={"dp": 1}, global_batch_size=4,
                      train_steps=6)

    def run(it):
        n = 0
        with pytest.raises(polyload.FormatError) as e:
            for _ in it:
                n += 1
        return n, type(e.value), e.value.message

    with polyload.Loader(cfg, rank=0) as loader:
        want = run(loader)
    assert "cut.tar" in want[2] and "b.jpg" in want[2] and "offset" in want[2]
    with pr.launch(cfg, num_source_loaders=1, namespace=NS, name="vlm_cut") as dep:
        with pr.Client(cfg, rank=0, namespace=NS, name="vlm_cut") as c:
            got = run(c)
    assert got == want


def test_instruction_data_in_the_deployment(cluster, tmp_path_factory):
    """prompt_key/response_key through the deployment: prompt tokens travel as -1 - id from
    the source loaders and the trainers' batches (labels, loss_mask) equal the embedded
    loader's."""
    import fortunes_corpus as fc

    corpus = fc.build(tmp_path_factory.mktemp("ray_fortunes"))
    path = str(tmp_path_factory.mktemp("ray_sft") / "sft.jsonl")
    with open(os.path.join(corpus["dir"], "wit.jsonl"), encoding="utf-8") as f, \
            open(path, "w", encoding="utf-8") as out:
        for line in list(f)[:200]:
            t = json.loads(line)["text"]
            head, _, tail = t.partition("\n")
            out.write(json.dumps({"q": head + "\n", "a": tail or t}) + "\n")
    cfg = fc.config(corpus, train_steps=6, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [{"name": "sft", "type": "jsonl", "path": path, "prompt_key": "q",
                       "response_key": "a", "weight": 1.0}]
    with pr.launch(cfg, num_source_loaders={"sft": 1}, num_constructors=1,
                   namespace=NS, name="sft"):
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="sft") for r in (0, 1)]
        got = {0: [], 1: []}
        masked = 0
        while True:
            b = [c.next_batch() for c in clients]
            if b[0] is None:
                break
            for r in (0, 1):
                got[r].append(batch_hash(b[r]))
                masked += int((b[r]["loss_mask"].numpy() == 0).sum())
        # closed here: a client left open reports from its thread after the session's
        # ray.shutdown(), which connects the process again and breaks the teardown
        for c in clients:
            c.close()
    for r in (0, 1):
        assert got[r] == loader_hashes(cfg, r)[0], r
    assert masked > 6 * 8 * 10  # prompts are masked, not only padding and ends
