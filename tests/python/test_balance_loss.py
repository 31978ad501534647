"""Loss normalization under ``balance: variable_length``.

A tiny decoder (examples/train_gpt.py's GPT: attention within each packed document,
rotary positions from ``position_ids``) takes one training step's gradient over every DP
rank's micro-batches, once with ``balance: none`` and once with ``variable_length`` on the
same documents.  With the step's count of loss tokens from the batches
(``polyload.torch.per_token_loss``) the two gradients are equal to float tolerance, while
the mean of per-rank mean losses (what a per-rank normalization averaged over DP gives)
is not, because variable_length gives the ranks unequal token counts.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

import polyload  # noqa: E402
from polyload.torch import per_token_loss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 101
DP = 4


def _gpt_module():
    spec = importlib.util.spec_from_file_location(
        "train_gpt_example", os.path.join(ROOT, "examples", "train_gpt.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _step_batches(corpus, balance):
    """Step 0's micro-batches of every DP rank: {dp_rank: [batch, ...]}."""
    cfg = corpus.config(global_batch_size=16, micro_batch_size=2, train_steps=1,
                        topology={"dp": DP, "pp": 1, "cp": 1, "tp": 1},
                        balance=balance, cost={"preset": "causal", "a": 64})
    nmb = 16 // (DP * 2)
    with polyload.Loader(cfg, rank=0, ranks=list(range(DP))) as ld:
        return {r: [ld.next_batch(r) for _ in range(nmb)] for r in range(DP)}


def _grads(model, batches, rank_mean):
    """The step's gradient, summed over ranks as DDP's all-reduce does (then / DP)."""
    model.zero_grad(set_to_none=True)
    F = torch.nn.functional
    for r, mbs in batches.items():
        rank_tokens = sum(int(b["loss_mask"].sum()) for b in mbs)
        for b in mbs:
            ids = b["input_ids"].long() % VOCAB
            logits = model(ids, b["position_ids"], b["cu_seqlens"])
            labels = torch.where(b["labels"] >= 0, b["labels"] % VOCAB, b["labels"]).long()
            tl = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100,
                                 reduction="none")
            if rank_mean:  # the rank's mean, averaged over ranks: biased under vlen
                loss = (tl * b["loss_mask"].reshape(-1)).sum() / rank_tokens
            else:
                loss = per_token_loss(tl, b, dp_size=DP)
            (loss / DP).backward()  # DDP averages gradients over the DP ranks
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def test_variable_length_gradients_equal_none(corpus):
    gpt = _gpt_module()
    torch.manual_seed(0)
    model = gpt.GPT(VOCAB, d_model=32, n_layers=2, n_heads=4).double()
    a = _step_batches(corpus, "none")
    b = _step_batches(corpus, "variable_length")
    # The same documents and loss tokens, in other places: rows of max_tokens (160 =
    # 1.25 x 2 x 64), unequal tokens per rank.
    assert a[0][0]["input_ids"].shape == (2, 64)
    assert b[0][0]["input_ids"].shape == (1, 160)
    for d in (a, b):
        counted = sum(int(x["loss_mask"].sum()) for mbs in d.values() for x in mbs)
        assert all(x["step_loss_tokens"] == counted for mbs in d.values() for x in mbs)
        for mbs in d.values():
            rank = sum(int(x["loss_mask"].sum()) for x in mbs)
            assert all(x["rank_loss_tokens"] == rank for x in mbs)
    assert a[0][0]["step_loss_tokens"] == b[0][0]["step_loss_tokens"]
    per_rank_b = [b[r][0]["rank_loss_tokens"] for r in range(DP)]
    assert len(set(per_rank_b)) > 1, per_rank_b
    ga, gb = _grads(model, a, False), _grads(model, b, False)
    scale = float(ga.abs().max())
    assert scale > 0
    assert float((ga - gb).abs().max()) <= 1e-9 * scale
    # The per-rank mean is not invariant: the test can tell the two apart.
    ra, rb = _grads(model, a, True), _grads(model, b, True)
    assert float((ra - rb).abs().max()) > 1e-4 * scale


def test_trim_padding(corpus):
    from polyload.torch import trim_padding

    b = _step_batches(corpus, "variable_length")
    trimmed = 0
    for mbs in b.values():
        for x in mbs:
            t = trim_padding(x)
            n = x["non_padding_tokens"]
            assert t["input_ids"].shape == (1, n)
            assert int(t["cu_seqlens"][-1]) == n
            assert torch.equal(t["input_ids"], x["input_ids"][:, :n])
            assert int(t["loss_mask"].sum()) == int(x["loss_mask"].sum())
            assert t["max_seqlen"] == int(t["cu_seqlens"].diff().max())
            trimmed += n < x["input_ids"].shape[1]
    assert trimmed > 0
    with pytest.raises(ValueError):
        trim_padding(_step_batches(corpus, "none")[0][0])  # two rows


def test_hf_num_items_in_batch(corpus):
    hf = pytest.importorskip("polyload.hf")
    b = _step_batches(corpus, "variable_length")[1][0]
    out = hf.causal_lm_batch(b, dp_size=DP)
    assert float(out["num_items_in_batch"]) == pytest.approx(b["step_loss_tokens"] / DP)
    assert "num_items_in_batch" not in hf.causal_lm_batch(b)
