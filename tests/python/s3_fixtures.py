"""Session fixtures for remote sources: a real S3-compatible server
(moto_server) on 127.0.0.1 with the fault-injecting proxy in front, both
started as their own processes for the session (tests/remote/s3env.py).
Test modules import them: ``from s3_fixtures import s3env, s3_environ``, and the
loader helpers the remote tests share (``quiet_loader``, ``batch_hashes``)."""

import os
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "remote"))

from s3env import S3Env  # noqa: E402


@pytest.fixture(scope="session")
def s3env():
    env = S3Env()
    env.start()
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def s3_environ(s3env, monkeypatch, tmp_path):
    """The process environment of a client of the proxy: credentials, the
    endpoint, a fresh cache directory, no faults left from another test."""
    s3env.faults(reset=True)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)
    for k, v in s3env.environ.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("POLYLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POLYLOAD_REMOTE_BACKOFF_MS", "10")
    return dict(os.environ)


def quiet_loader(cfg, **kw):
    """polyload.Loader(cfg, **kw) without the configs' warnings (a cache setting on a
    local run, and the like)."""
    import polyload  # noqa: PLC0415
    from polyload import ConfigWarning  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return polyload.Loader(cfg, **kw)


def batch_hashes(cfg, rank=0, steps=None, state=None):
    """Hashes of rank's batches (after loading state; the first `steps` only)."""
    from conftest import batch_hash  # noqa: PLC0415

    out = []
    with quiet_loader(cfg, rank=rank) as ld:
        if state is not None:
            ld.load_state_dict(state)
        for b in ld:
            out.append(batch_hash(b))
            if steps is not None and len(out) >= steps:
                break
    return out
