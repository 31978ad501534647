"""Start an S3-compatible server (moto's standalone server) on 127.0.0.1 and
the fault-injecting proxy in front of it, each as its own process; used by
tests/python/test_remote*.py (session fixtures) and bench/remote/.

    with S3Env() as env:          # server and proxy up, credentials in env.environ
        env.put_tree(bucket, prefix, local_dir)
        env.faults(latency_ms=20)
        env.proxy_url             # AWS_ENDPOINT_URL for clients under test
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port, proc, what, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def _moto_server():
    """The moto_server beside this interpreter (the project's .venv)."""
    cand = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if os.path.exists(cand):
        return [cand]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


class S3Env:
    """moto_server + faultproxy.py, stopped on exit."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="pl-s3env-")
        self.server = self.proxy = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        port = _free_port()
        log = open(os.path.join(self.tmp, "moto.log"), "wb")
        self.server = subprocess.Popen(_moto_server() + ["-H", "127.0.0.1", "-p", str(port)],
                                       stdout=log, stderr=subprocess.STDOUT)
        _wait_port(port, self.server, "moto_server")
        self.server_url = f"http://127.0.0.1:{port}"
        port_file = os.path.join(self.tmp, "proxy.port")
        plog = open(os.path.join(self.tmp, "proxy.log"), "wb")
        self.proxy = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "faultproxy.py"), "--upstream", self.server_url,
             "--port", "0", "--port-file", port_file], stdout=plog, stderr=subprocess.STDOUT)
        end = time.monotonic() + 30
        while not os.path.exists(port_file):
            if self.proxy.poll() is not None or time.monotonic() > end:
                raise RuntimeError("faultproxy did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            pport = int(f.read())
        _wait_port(pport, self.proxy, "faultproxy")
        self.proxy_url = f"http://127.0.0.1:{pport}"
        # Test credentials (moto accepts any); the region must match the signature's.
        self.environ = {
            "AWS_ACCESS_KEY_ID": "testing-key-id",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.proxy_url,
        }

    def stop(self):
        for p in (self.proxy, self.server):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def client(self, direct=True):
        import boto3
        return boto3.client("s3", endpoint_url=self.server_url if direct else self.proxy_url,
                            aws_access_key_id="testing-key-id",
                            aws_secret_access_key="testing-secret", region_name="us-east-1")

    def bucket(self, name):
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def put(self, bucket, key, data):
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def put_tree(self, bucket, prefix, local_dir):
        """Upload every file under local_dir to s3://bucket/prefix/<relative path>."""
        self.bucket(bucket)
        c = self.client()
        for root, _, files in os.walk(local_dir):
            for fn in sorted(files):
                p = os.path.join(root, fn)
                rel = os.path.relpath(p, local_dir)
                c.upload_file(p, bucket, f"{prefix}/{rel}" if prefix else rel)

    def faults(self, **cfg):
        req = urllib.request.Request(self.proxy_url + "/__faults__", method="POST",
                                     data=json.dumps(cfg).encode())
        urllib.request.urlopen(req, timeout=10).read()

    def stats(self):
        with urllib.request.urlopen(self.proxy_url + "/__stats__", timeout=10) as r:
            return json.loads(r.read())
