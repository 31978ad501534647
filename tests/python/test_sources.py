"""Batches say where they come from (``Loader(..., with_sources=True)``): the source of
every ``cu_seqlens`` segment, and the step and micro-batch, checked against the token values
of the position corpus (a token names its source) and against the plan; and a tiny model
trained on real text (Debian fortunes) whose loss is logged per source."""

import warnings

import numpy as np
import pytest
import yaml

import fortunes_corpus
import polyload
from polyload import ConfigWarning, _core
from conftest import SOURCE_BASE

torch = pytest.importorskip("torch")
from polyload.torch import loss_by_source, token_sources  # noqa: E402


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _loader(cfg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return polyload.Loader(cfg, **kw)


@pytest.mark.parametrize("cp", [1, 2])
def test_segment_sources_name_every_token(corpus, cp):
    cfg = corpus.config(train_steps=6, topology={"dp": 2, "cp": cp})
    nmb = 8 // (2 * 2)
    with _loader(cfg, rank=0, with_sources=True) as loader:
        assert loader.source_names == ("s0", "s1", "s2")
        for k, b in enumerate(loader):
            assert (b["step"], b["micro_batch"]) == (k // nmb, k % nmb)
            seg = b["segment_sources"]
            assert seg.dtype == torch.int32 and seg.shape == (b["cu_seqlens"].numel() - 1,)
            src = token_sources(b).numpy()
            ids = b["input_ids"].numpy()
            real = ids != 0  # pad_id 0 never occurs in the corpus
            np.testing.assert_array_equal(src[real], ids[real] // SOURCE_BASE - 1)
            # a segment is a source's or padding: padding (-1) holds pad tokens only
            assert (ids[src == -1] == 0).all()
    with _loader(cfg, rank=0) as loader:  # off by default: the SPEC fields only
        assert "segment_sources" not in next(loader) and "step" not in next(loader)


def test_segment_sources_equal_the_plan(corpus):
    cfg = corpus.config(train_steps=4, topology={"dp": 2})
    planner = _core.Planner.create(_core.Config.parse_string(yaml.safe_dump(cfg)))
    with _loader(cfg, rank=1, ranks=[0, 1], with_sources=True) as loader:
        for step in range(4):
            plan = planner.next()
            chunks = np.asarray(plan["chunks"])
            offs, rank_seq = np.asarray(plan["seq_offsets"]), np.asarray(plan["rank_sequences"])
            rows, nmb = plan["micro_batch_size"], plan["micro_batches_per_rank"]
            for mb in range(nmb):
                for r in (0, 1):
                    b = loader.next_batch(r)
                    want = []
                    for row in range(rows):
                        q = rank_seq[(r * nmb + mb) * rows + row]
                        seq = chunks[offs[q]:offs[q + 1]]
                        want += [int(c[0]) for c in seq]
                        if sum(int(c[3]) for c in seq) < plan["seq_length"]:
                            want.append(-1)
                    assert b["segment_sources"].tolist() == want


def test_loss_logged_per_source(tmp_path_factory):
    """A bigram model (embedding -> logits) trained for a few steps on two real-text
    sources; the loss logged per source adds up to the step's loss, and each source's
    token count is the number of its tokens with a label in the step."""
    fc = fortunes_corpus.build(tmp_path_factory.mktemp("fortunes"))
    cfg = fortunes_corpus.config(fc, train_steps=6, topology={"dp": 1})
    torch.manual_seed(0)
    model = torch.nn.Embedding(fc["vocab_size"], fc["vocab_size"])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    log = []
    with _loader(cfg, rank=0, with_sources=True) as loader:
        names = loader.source_names
        assert names == ("tech", "wit")
        per_step = {}
        for b in loader:
            logits = model(b["input_ids"])
            lab = b["labels"]
            tok = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), lab.reshape(-1).clamp(min=0),
                reduction="none").reshape(lab.shape) * b["loss_mask"]
            loss = tok.sum() / b["loss_mask"].sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            by = loss_by_source(tok, b, names)
            assert sum(v[0] for v in by.values()) == pytest.approx(float(tok.detach().sum()), rel=1e-6)
            assert sum(v[1] for v in by.values()) == int(b["loss_mask"].sum())
            acc = per_step.setdefault(b["step"], {})
            for name, (s, n) in by.items():
                ps, pn = acc.get(name, (0.0, 0))
                acc[name] = (ps + s, pn + n)
        for step, acc in sorted(per_step.items()):
            log.append({"step": step, **{f"loss/{n}": s / c for n, (s, c) in acc.items()}})
        stats = loader.stats()
    assert [e["step"] for e in log] == list(range(6))
    assert all(set(e) == {"step", "loss/tech", "loss/wit"} for e in log)
    # every source's documents were logged under its own name, and the tokens add up:
    # stats count tokens per source (labelled or not, one end token per document)
    assert all(np.isfinite(v) for e in log for k, v in e.items() if k != "step")
    assert log[-1]["loss/tech"] < log[0]["loss/tech"]  # the model learns
    assert stats["sources"]["tech"]["tokens"] > 0 and stats["sources"]["wit"]["tokens"] > 0
