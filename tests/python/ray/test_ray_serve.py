"""Deployments run from the command line and found again: ``polyload serve`` (with
``--autoscale``), ``polyload top``, and ``polyload.ray.attach`` to a detached
deployment."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from polyload import _core

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pr = pytest.importorskip("polyload.ray")

from ray_helpers import NS, _alive, loader_hashes, client_hashes, _names_gone  # noqa: E402


def test_serve_cli(cluster, corpus2, tmp_path):
    import yaml

    cfg = corpus2.config(train_steps=3)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyload", "serve", str(path), "--ray-address", cluster.address,
         "--namespace", NS, "--name", "served", "--num-source-loaders", "2",
         "--num-constructors", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        desc = json.loads(line)
        assert desc["constructors"] == ["served.constructor.0", "served.constructor.1"]
        with pr.Client(str(path), rank=0, namespace=NS, name="served") as c:
            assert client_hashes(c) == loader_hashes(cfg, 0)[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    bad = subprocess.run([sys.executable, "-m", "polyload", "serve", str(tmp_path / "nope.yaml"),
                          "--ray-address", cluster.address], capture_output=True, text=True)
    assert bad.returncode in (1, 2) and "polyload serve" in bad.stderr


def test_serve_autoscale_and_top_cli(cluster, corpus2, tmp_path):
    """``polyload serve --autoscale`` and ``polyload top``: the live view names every
    source with its loaders and shows a manual scaling decision; bad arguments fail
    with exit codes 1 and 2."""
    import yaml

    cfg = corpus2.config(train_steps=3)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyload", "serve", str(path), "--ray-address", cluster.address,
         "--namespace", NS, "--name", "topped", "--autoscale", '{"max_loaders": 2}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline(), proc.stderr.read()
        scaler = ray.get_actor("topped.autoscaler", namespace=NS)
        ray.get(scaler.scale.remote("s1", 2))
        top = [sys.executable, "-m", "polyload", "top", "--ray-address", cluster.address,
               "--namespace", NS, "--name", "topped", "--once"]
        out = subprocess.run(top + ["--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout.splitlines()[-1])
        assert [s["source"] for s in view["sources"]] == ["s0", "s1", "s2"]
        assert next(s for s in view["sources"] if s["source"] == "s1")["dedicated"] == 2
        table = subprocess.run(top, capture_output=True, text=True, timeout=120)
        assert table.returncode == 0, table.stderr
        assert "s1" in table.stdout and "manual: Deployment.scale" in table.stdout
        missing = subprocess.run(top[:-3] + ["--name", "nope", "--once"], capture_output=True,
                                 text=True, timeout=120)
        assert missing.returncode == 1 and "no deployment" in missing.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    bad = subprocess.run([sys.executable, "-m", "polyload", "serve", str(path), "--ray-address",
                          cluster.address, "--autoscale", "{nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--autoscale: not JSON" in bad.stderr


def test_attach_to_a_detached_deployment(cluster, corpus2, tmp_path):
    """A detached deployment outlives the process that launched it; another process
    attaches by name, scales it, takes its state, and shuts it down (every actor gone,
    also the loaders the autoscaler started)."""
    import yaml

    cfg = corpus2.config(train_steps=5)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    script = (
        "import ray, polyload.ray as pr\n"
        f"ray.init(address={cluster.address!r}, namespace={NS!r}, log_to_driver=False)\n"
        f"pr.launch({str(path)!r}, namespace={NS!r}, name='detached', detached=True)\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    with pytest.raises(ValueError, match="no deployment"):
        pr.attach("nope", NS)
    dep = pr.attach("detached", NS)
    assert dep.info["constructors"] == ["detached.constructor.0"]
    dep.scale("s0", 2)
    for r in (0, 1):  # both DP ranks, so that every step is delivered
        with pr.Client(str(path), rank=r, namespace=NS, name="detached") as c:
            assert client_hashes(c) == loader_hashes(cfg, r)[0]
    names = {n for sl in dep.scaling()["slots"] for n in sl["actors"]}
    assert "detached.source_loader.3" in names  # one of the two started for s0
    state = dep.state_dict()
    assert _core.state_info(state["blob"])["step"] == 5
    dep.shutdown()
    left = _names_gone(set(names) | {"detached.planner", "detached.autoscaler"})
    assert not left, sorted(left)


def test_default_requests_fit_a_small_cluster(monkeypatch):
    """On a 2-CPU cluster the default role requests are scaled down to fit, with a
    warning; requests the caller set are refused with the numbers."""
    from polyload.ray import _placement

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.warns(RuntimeWarning, match="scaled by 0.727 to fit"):
        p = _placement.check_cpus(None, 1, 1, None, 3)  # 0.25 + 1 + 3 x 0.5 = 2.75
    need = p["planner"]["num_cpus"] + p["constructor"]["num_cpus"] + \
        3 * p["source_loader"]["num_cpus"]
    assert 1.9 < need <= 2.0
    with pytest.raises(ValueError, match="ask for 2.75 CPUs"):
        _placement.check_cpus({"constructor": {"num_cpus": 1.0}}, 1, 1, None, 3)
    assert _placement.check_cpus(None, 1, 1, None, 1) is None  # 1.75 fits


def test_info_pids_follow_a_restart(cluster, corpus2):
    cfg = corpus2.config(train_steps=2)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="pids", timeout=60) as dep:
        old = dep.info["pids"]["source_loader"][0]
        assert old == dep.pids()["source_loader"][0]
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 90
        new = old
        while new == old and time.monotonic() < deadline:
            time.sleep(0.5)
            new = dep.info["pids"]["source_loader"][0]
        assert new != old and _alive(new)


def test_serve_prints_pids(cluster, corpus2, tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(json.dumps(corpus2.config(train_steps=2)))
    p = subprocess.Popen([sys.executable, "-m", "polyload", "serve", str(path), "--ray-address",
                          cluster.address, "--namespace", NS, "--name", "servepids"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = json.loads(p.stdout.readline())
        assert set(line["pids"]) >= {"planner", "source_loader", "constructor"}
        assert all(isinstance(x, int) and _alive(x) for xs in line["pids"].values() for x in xs)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)
    assert p.returncode == 0, p.stderr.read()
