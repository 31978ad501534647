"""The pure parts of polyload.ray, without a Ray cluster: the names and key-value store
keys of a deployment (one module builds them all, so the actors, the deployment handle,
the Client and the CLIs cannot disagree), and a fetch's answer packed and unpacked."""

import numpy as np

from polyload.ray import _registry as reg
from polyload.ray._protocol import pack_fetch, unpack_fetch


def test_actor_names_and_keys():
    assert reg.planner("d") == "d.planner" and reg.autoscaler("d") == "d.autoscaler"
    assert reg.source_loader("d", 3) == "d.source_loader.3"
    assert reg.source_loader_slot("d", 3, 2) == [
        "d.source_loader.3", "d.source_loader.3.shadow.0", "d.source_loader.3.shadow.1"]
    assert reg.constructor("d", 1) == "d.constructor.1"
    assert reg.constructor("d", 1, 0) == "d.constructor.1.shadow.0"
    assert reg.slot_of("d", "d.source_loader.12.shadow.1") == 12
    assert reg.slot_of("d", "d.source_loader.x") is None
    assert reg.slot_of("d", "e.source_loader.1") is None
    mine = reg.actor_pattern("d")
    for n in ("d.planner", "d.autoscaler", "d.constructor.0", "d.constructor.0.shadow.2",
              "d.source_loader.7", "d.source_loader.7.shadow.0"):
        assert mine.match(n), n
    for n in ("dd.planner", "d.planner.x", "e.source_loader.1", "d.constructor"):
        assert not mine.match(n), n
    # the store's keys: a source loader's partitions sit under the deployment's prefix
    assert reg.config_key("ns", "d") == b"polyload:ns:d.config"
    assert reg.checkpoint_key("ns", reg.planner("d")) == b"polyload:ns:d.planner"
    key = reg.shards_key("ns", reg.source_loader("d", 2, 0))
    assert key == b"polyload:ns:d.source_loader.2.shadow.0.shards"
    assert key.startswith(reg.shards_prefix("ns", "d"))
    assert not reg.shards_key("ns", reg.source_loader("dd", 2)).startswith(
        reg.shards_prefix("ns", "d"))


def test_fetch_answer_round_trip():
    pkgs = [np.arange(n, dtype=np.uint8) for n in (3, 0, 5)]
    out, final, err = unpack_fetch(pack_fetch(list(pkgs)))
    assert [p.tolist() for p in out] == [p.tolist() for p in pkgs]
    assert final is None and err is None
    out, final, err = unpack_fetch(pack_fetch(pkgs[:1] + [b"state"], (-5, "bad step")))
    assert [p.tolist() for p in out] == [[0, 1, 2]] and final == b"state"
    assert err == (-5, "bad step")
    assert len(pack_fetch([np.zeros(2, np.uint8)])) == 3  # no error: three elements
    out, final, err = unpack_fetch(pack_fetch([]))
    assert out == [] and final is None and err is None
