"""The checkers of the peer benchmark (bench/peers/common.py) on polyload itself and on
hand-made deliveries: each must say yes where the delivery is right and no, with the
count, where it is not.  The peer libraries themselves are not needed (nor installed)."""

import os
import sys
import types
from collections import Counter

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "peers"))
import common as C  # noqa: E402
import peer_polyload as P  # noqa: E402


def test_mixture_error_per_step_and_cumulative():
    w = [0.5, 0.25, 0.25, 0.0]
    # step 0 exact; step 1 source 0 short by 10 tokens (given to source 1)
    rows = [[50, 25, 25, 0], [40, 35, 25, 0]]
    m = C.mixture_error(rows, w)
    assert m["per_step_max"] == pytest.approx(10.0)
    assert m["cumulative_max"] == pytest.approx(10.0)
    assert m["steps"] == 2 and m["tokens_per_step"] == 100
    assert m["realized_fraction"] == pytest.approx([0.45, 0.3, 0.25, 0.0])
    # errors that cancel over the steps: 5 per step, cumulative 5 then 0
    m = C.mixture_error([[55, 20, 25, 0], [45, 30, 25, 0]], w)
    assert m["per_step_max"] == pytest.approx(5.0) and m["cumulative_max"] == pytest.approx(5.0)
    assert m["realized_fraction"] == pytest.approx([0.5, 0.25, 0.25, 0.0])


def _index(small=5, big=50):
    idx = types.SimpleNamespace()
    idx.expected = [Counter({s * C.SID_BASE + j: 1 for j in range(big if s < 3 else small)})
                    for s in range(4)]
    return idx


def _ids(src, js, tok=10):
    return [(src * C.SID_BASE + j, tok) for j in js]


def test_epoch_check_yes_and_each_kind_of_no():
    idx = _index()
    before = _ids(3, [0, 1]) + _ids(0, [0])
    # after the resume: tokens 20/40/60/80 = the new weights 0.1/0.2/0.3/0.4; the small
    # source completes its epoch (2, 3, 4) and starts the next one (0) in the last step
    rest = _ids(1, range(4)) + _ids(2, range(6))
    after = _ids(0, [1, 2]) + rest + _ids(3, [2, 3, 4, 0], tok=20)
    r = C.epoch_check(idx, before, after, last_step_ids=_ids(3, [0], tok=20))
    assert r["result"] == "yes", r
    assert r["after_fraction"] == pytest.approx(C.REWEIGHTS)
    # sample 1 delivered again after the resume and sample 4 never
    bad = _ids(0, [1, 2]) + rest + _ids(3, [1, 2, 3, 1], tok=20)
    r = C.epoch_check(idx, before, bad, last_step_ids=[])
    assert r["result"] == "no" and r["missing_in_epoch"] == 1 and r["repeated_in_epoch"] == 2
    # a repeat in a source that is still in its first epoch
    rep = _ids(0, [0, 2]) + rest + _ids(3, [2, 3, 4, 0], tok=20)
    r = C.epoch_check(idx, before, rep, last_step_ids=_ids(3, [0], tok=20))
    assert r["result"] == "no" and r["repeated_other_sources"] == 1
    # the new weights not followed
    r = C.epoch_check(idx, before, _ids(0, [1, 2]) + rest + _ids(3, [2, 3, 4, 0]),
                      last_step_ids=_ids(3, [0]))
    assert r["result"] == "no"


def _polyload_peer(corpus, broken=False):
    cfg = corpus.config(train_steps=40)

    def loader(seq, weights=None):
        import polyload

        return P.RoundRobin(polyload.Loader(cfg, rank=0, ranks=[0, 1]), 2)

    def resume(seq, st, weights=None):
        it = loader(seq)
        if not broken:
            it.loader.load_state_dict(st["loader"])
            it.i = st["next"]
        return it

    return types.SimpleNamespace(NAME="polyload", loader=loader, state=P.state, resume=resume,
                                 close=P.close)


def test_resume_check_on_polyload(corpus):
    # 4 micro-batches per step (global 8 / mb 2), 2 per rank: K=6 is mid-step, with both
    # served ranks at the same position (as ranks of a trainer save their state)
    r = C.resume_check(_polyload_peer(corpus), corpus.seq_length, 6, 20, reweight=False)
    assert r["result"] == "yes" and r["compared"] == 20, r
    r = C.resume_check(_polyload_peer(corpus, broken=True), corpus.seq_length, 6, 20,
                       reweight=False)
    assert r["result"] == "no" and r["first_difference"] == 0, r


def test_resume_check_reports_a_peer_without_state():
    peer = types.SimpleNamespace(NAME="x", NO_STATE="no state API")
    assert C.resume_check(peer, 64, 1, 1, reweight=False) == \
        {"result": "no", "what_happened": "no state API"}
