"""Session fixtures for remote sources: a real S3-compatible server
(moto_server) on 127.0.0.1 with the fault-injecting proxy in front, both
started as their own processes for the session (tests/remote/s3env.py).
Test modules import them: ``from s3_fixtures import s3env, s3_environ``."""

import os
import sys

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
