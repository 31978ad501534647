"""The remote I/O layer (src/source/remote/) against a real S3-compatible
server, through the fault-injecting proxy: ranged reads, listing, retries,
deadlines, replaced objects, the node-local cache.  Driven through
build/remote_tool (tests/remote/remote_tool.c)."""

import json
import os
import subprocess
import threading

import pytest

from s3_fixtures import ROOT, s3env, s3_environ  # noqa: F401

# PL_REMOTE_TOOL: another build of it (build-asan/remote_tool under ASan/UBSan).
TOOL = os.environ.get("PL_REMOTE_TOOL") or os.path.join(ROOT, "build", "remote_tool")
DATA = bytes((i * 7 + i // 251) & 0xFF for i in range(3 * 1024 * 1024 + 123))


def run(env, *args, check=True, timeout=120):
    r = subprocess.run([TOOL, *args], env=env, capture_output=True, timeout=timeout)
    lines = r.stderr.decode().strip().splitlines()
    stats = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if check and r.returncode != 0:
        raise AssertionError(r.stderr.decode())
    return r, stats


@pytest.fixture(scope="module")
def bucket(s3env):
    b = s3env.bucket("pl-remote")
    s3env.put(b, "data/a.bin", DATA)
    s3env.put(b, "data/b c&d.bin", b"spaces and ampersand")
    s3env.put(b, "data/sub/c.bin", b"x" * 10)
    s3env.put(b, "other/z.bin", b"z")
    return b


def test_tool_built():
    assert os.path.exists(TOOL), "make build builds build/remote_tool"


def test_head_get_list(bucket, s3_environ):
    r, _ = run(s3_environ, "head", f"s3://{bucket}/data/a.bin")
    size, etag = r.stdout.decode().split()
    assert int(size) == len(DATA) and etag.startswith('"')
    r, st = run(s3_environ, "get", f"s3://{bucket}/data/a.bin", "0:10", "1000000:5000",
                f"{len(DATA) - 7}:7")
    assert r.stdout == DATA[:10] + DATA[1000000:1005000] + DATA[-7:]
    assert st["requests"] == 4 and st["retries"] == 0  # HEAD + three ranges
    r, _ = run(s3_environ, "get", f"s3://{bucket}/data/b c&d.bin", "0:20")
    assert r.stdout == b"spaces and ampersand"
    r, st = run(s3_environ, "list", f"s3://{bucket}/data/")
    assert r.stdout.decode().split("\n")[:-1] == [
        f"s3://{bucket}/data/a.bin", f"s3://{bucket}/data/b c&d.bin",
        f"s3://{bucket}/data/sub/c.bin"]
    assert st["lists"] == 1


def test_missing_object(bucket, s3_environ):
    r, _ = run(s3_environ, "head", f"s3://{bucket}/data/nope.bin", check=False)
    assert r.returncode == 1
    msg = r.stderr.decode()
    assert f"s3://{bucket}/data/nope.bin" in msg and "404" in msg


def test_listing_pages(s3env, s3_environ):
    b = s3env.bucket("pl-many")
    for i in range(1100):  # more than one page of 1,000 keys
        s3env.put(b, f"p/k{i:05d}", b"")
    r, st = run(s3_environ, "list", f"s3://{b}/p/")
    keys = r.stdout.decode().split()
    assert keys == [f"s3://{b}/p/k{i:05d}" for i in range(1100)]
    assert st["lists"] == 2


@pytest.mark.parametrize("fault", ["http503", "cut", "truncate"])
def test_faults_are_retried(s3env, bucket, s3_environ, fault):
    s3env.faults(**{fault: 3})
    ranges = [f"{o}:{300000}" for o in range(0, 3000000, 600000)]
    r, st = run(s3_environ, "get", f"s3://{bucket}/data/a.bin", *ranges)
    want = b"".join(DATA[o:o + 300000] for o in range(0, 3000000, 600000))
    assert r.stdout == want
    assert st["retries"] == 3
    assert s3env.stats()["injected"] == 3


def test_retries_exhausted_name_object_range_status(s3env, bucket, s3_environ):
    s3env.faults(http503=100)
    env = dict(s3_environ, POLYLOAD_REMOTE_ATTEMPTS="3")
    r, st = run(env, "get", f"s3://{bucket}/data/a.bin", "100:50", check=False)
    msg = r.stderr.decode()
    assert r.returncode == 1
    assert f"s3://{bucket}/data/a.bin: bytes [100, 150): failed after 3 attempts; last: HTTP 503" in msg
    assert st["retries"] == 2
    assert "testing-secret" not in msg and "testing-key-id" not in msg


def test_deadline_per_request(s3env, bucket, s3_environ):
    # A reply that never comes is a timeout per request, retried, then an error.
    s3env.faults(stall=100, stall_ms=5000)
    env = dict(s3_environ, POLYLOAD_REMOTE_ATTEMPTS="2", POLYLOAD_REMOTE_DEADLINE_MS="300")
    r, st = run(env, "get", f"s3://{bucket}/data/a.bin", "0:10", check=False)
    msg = r.stderr.decode()
    assert r.returncode == 1 and "failed after 2 attempts" in msg and "imeout" in msg
    assert st["retries"] == 1


def test_replaced_object_is_an_error(s3env, bucket, s3_environ, tmp_path):
    s3env.put(bucket, "data/replaced.bin", DATA[:100000])
    go = tmp_path / "go"
    p = subprocess.Popen([TOOL, "get", f"s3://{bucket}/data/replaced.bin", "--wait", str(go),
                          "0:1000"], env=s3_environ, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    # Wait until it has opened (HEAD), then replace the object.
    line = p.stderr.readline()
    assert line.strip() == b"opened"
    s3env.put(bucket, "data/replaced.bin", DATA[1:100001])
    go.write_text("")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and out == b""
    assert b"replaced since it was opened" in err and b"[0, 1000)" in err


def test_cache_second_read_makes_no_request(s3env, bucket, s3_environ, tmp_path):
    cache = str(tmp_path / "c")
    url = f"s3://{bucket}/data/a.bin"
    r, st = run(s3_environ, "cached", cache, str(1 << 30), str(1 << 20), url,
                "10:100", "2200000:300000")
    assert r.stdout == DATA[10:110] + DATA[2200000:2500000]
    assert st["requests"] == 3  # HEAD, chunk 0, chunk 2 (one request each)
    assert st["bytes"] == 2 * (1 << 20)
    # Another process, the same cache: only the HEAD.
    before = s3env.stats()["GET"]
    r, st = run(s3_environ, "cached", cache, str(1 << 30), str(1 << 20), url,
                "50:1000", "2100000:10")
    assert r.stdout == DATA[50:1050] + DATA[2100000:2100010]
    assert st["requests"] == 1 and s3env.stats()["GET"] == before
    # Adjacent chunks come in one request.
    r, st = run(s3_environ, "cached", str(tmp_path / "c2"), str(1 << 30), str(1 << 20), url,
                f"0:{len(DATA)}")
    assert r.stdout == DATA and st["requests"] == 2


def _cached_bytes(cache):
    total = 0
    for root, _, files in os.walk(cache):
        for f in files:
            if f.endswith(".data"):
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def test_cache_is_bounded_lru(s3env, bucket, s3_environ, tmp_path):
    cache = str(tmp_path / "c")
    env = dict(s3_environ, POLYLOAD_CACHE_GRACE_S="0")
    url = f"s3://{bucket}/data/a.bin"
    bound = 2 * (1 << 20) + 1000
    for off in (0, 1 << 20, 2 << 20, 3 << 20):  # four 1 MiB chunks, two fit
        if off >= len(DATA):
            break
        r, _ = run(env, "cached", cache, str(bound), str(1 << 20), url, f"{off}:100")
        assert r.stdout == DATA[off:off + 100]
        assert _cached_bytes(cache) <= bound + 64 * 1024
    # The most recent chunk is still there (no request), the first was evicted.
    r, st = run(env, "cached", cache, str(bound), str(1 << 20), url, f"{3 << 20}:100")
    assert st["requests"] == 1
    r, st = run(env, "cached", cache, str(bound), str(1 << 20), url, "0:100")
    assert r.stdout == DATA[:100] and st["requests"] == 2


def test_cache_shared_by_concurrent_processes(s3env, bucket, s3_environ, tmp_path):
    cache = str(tmp_path / "c")
    url = f"s3://{bucket}/data/a.bin"
    outs = [None] * 4

    def one(i):
        outs[i] = run(s3_environ, "cached", cache, str(1 << 30), str(1 << 20), url,
                      f"0:{len(DATA)}")[0].stdout

    ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(o == DATA for o in outs)
    assert _cached_bytes(cache) <= len(DATA) + 64 * 1024


def test_listing_gives_the_size_and_etag_of_head(s3env, bucket, s3_environ):
    # A multipart object too: its ETag ("...-2") is not an MD5, and the listing
    # must give the same one as HEAD (ranged GETs compare it).
    c = s3env.client()
    key = "data/multi.bin"
    up = c.create_multipart_upload(Bucket=bucket, Key=key)
    part = DATA[: 5 * 1024 * 1024] if len(DATA) >= 5 << 20 else (DATA * 2)[: 5 << 20]
    parts = []
    for n, body in ((1, part), (2, b"tail")):
        r = c.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n,
                          Body=body)
        parts.append({"ETag": r["ETag"], "PartNumber": n})
    c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                MultipartUpload={"Parts": parts})
    r, st = run(s3_environ, "listx", f"s3://{bucket}/data/")
    listed = {u: (int(n), e) for u, n, e in (ln.rsplit(" ", 2) for ln in
                                             r.stdout.decode().splitlines())}
    assert st["lists"] == 1 and st["heads"] == 0
    assert f"s3://{bucket}/data/multi.bin" in listed
    assert listed[f"s3://{bucket}/data/multi.bin"][1].endswith('-2"')
    for url, (size, etag) in listed.items():
        h, _ = run(s3_environ, "head", url)
        hsize, hetag = h.stdout.decode().split()
        assert (size, etag) == (int(hsize), hetag), url


def test_cache_count_rebuilt_from_the_tables(s3env, bucket, s3_environ, tmp_path):
    """The bytes-present count in the lock file only spares scans of the
    tables: a cache whose count is missing, damaged or left low by a scan a
    minute old still keeps its bound."""
    cache = tmp_path / "c"
    env = dict(s3_environ, POLYLOAD_CACHE_GRACE_S="0")
    url = f"s3://{bucket}/data/a.bin"
    bound = 2 * (1 << 20) + 1000
    run(env, "cached", str(cache), str(bound), str(1 << 20), url, "0:100", f"{1 << 20}:100")
    lock = (cache / "lock").read_bytes()
    assert lock[:8] == b"PLUSAGE1" and int.from_bytes(lock[8:16], "little") == 2 << 20
    i64 = lambda x: x.to_bytes(8, "little", signed=True)  # noqa: E731
    for k, damaged in enumerate((b"", b"PLUSAGE1" + i64(-5) + lock[16:24], b"garbage!" * 3,
                                 b"PLUSAGE1" + i64(0) + i64(0))):
        (cache / "lock").write_bytes(damaged)
        off = (2, 0, 1, 2)[k] << 20  # each a chunk the cache no longer holds: a fetch
        r, _ = run(env, "cached", str(cache), str(bound), str(1 << 20), url, f"{off}:100")
        assert r.stdout == DATA[off:off + 100]
        assert _cached_bytes(cache) <= bound + 64 * 1024, damaged
        n = int.from_bytes((cache / "lock").read_bytes()[8:16], "little")
        assert n >= _cached_bytes(cache) - 64 * 1024  # errs high, never low


def test_object_replaced_after_the_listing_is_an_error(s3env, bucket, s3_environ, tmp_path):
    """An object opened with the listing's size and ETag (no HEAD) that is
    replaced between the listing and its first read is an error, never read
    as the new bytes nor mixed (the ranged GET carries the listed ETag)."""
    s3env.put(bucket, "data/relisted.bin", DATA[:100000])
    go = tmp_path / "go"
    url = f"s3://{bucket}/data/relisted.bin"
    p = subprocess.Popen([TOOL, "listed", str(tmp_path / "c"), str(1 << 30), str(1 << 16),
                          f"s3://{bucket}/data/", "--wait", str(go), url, "0:1000"],
                         env=s3_environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr.readline().strip() == b"listed"
    s3env.put(bucket, "data/relisted.bin", DATA[1:100001])
    go.write_text("")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and out == b""
    assert b"replaced since it was opened" in err and b"[0, 65536)" in err
    assert json.loads(err.decode().strip().splitlines()[-1])["heads"] == 0


def test_object_replaced_between_runs_is_read_anew(s3env, bucket, s3_environ, tmp_path):
    """A warm cache holds the old version; a new listing gives the new ETag,
    so the new bytes are fetched, never the old ones served."""
    cache = str(tmp_path / "c")
    url = f"s3://{bucket}/data/between.bin"
    s3env.put(bucket, "data/between.bin", DATA[:50000])
    args = ["listed", cache, str(1 << 30), str(1 << 16), f"s3://{bucket}/data/", url, "0:50000"]
    r, st = run(s3_environ, *args)
    assert r.stdout == DATA[:50000] and st["heads"] == 0 and st["requests"] == 2  # LIST, GET
    r, st = run(s3_environ, *args)
    assert r.stdout == DATA[:50000] and st["requests"] == 1  # the LIST only
    s3env.put(bucket, "data/between.bin", DATA[7:50007])
    r, st = run(s3_environ, *args)
    assert r.stdout == DATA[7:50007] and st["requests"] == 2 and st["heads"] == 0


def test_ensure_never_returns_with_its_own_chunks_evicted(s3env, bucket, s3_environ, tmp_path):
    """Ranges fetched in several batches, with no grace (POLYLOAD_CACHE_GRACE_S=0) and a
    bound smaller than the ranges together: a later batch's eviction takes chunks of an
    earlier one. The ensure looks again before it returns, so the bytes read are right
    or the read is an error naming the object and the bound; never zeros from a hole."""
    url = f"s3://{bucket}/data/a.bin"
    ranges = [(k * 8192, 100) for k in range(100)]  # 100 chunks of 4 KiB, 2 fetch batches
    args = [f"{o}:{n}" for o, n in ranges]
    want = b"".join(DATA[o:o + n] for o, n in ranges)
    env = dict(s3_environ, POLYLOAD_CACHE_GRACE_S="0")
    r, _ = run(env, "cached", str(tmp_path / "small"), str(300 * 1024), "4096", url, *args,
               check=False)
    assert r.returncode != 0 and r.stdout != want
    msg = r.stderr.decode()
    assert "evicted again before they could be read" in msg and url in msg
    assert "cache.max_bytes 307200" in msg
    # The same with room for the ranges: every byte right.
    r, _ = run(env, "cached", str(tmp_path / "big"), str(1 << 20), "4096", url, *args)
    assert r.stdout == want


def test_chunk_touched_after_the_evictors_clock_is_not_evicted(s3env, bucket, s3_environ,
                                                                tmp_path):
    """A chunk whose last use is later than the evicting process's clock (touched by a
    reader after the eviction scan read the time, or by a process whose clock is ahead)
    was used within the grace: it is kept, not taken as the oldest of all (its age as an
    unsigned difference wrapped past the grace)."""
    import struct
    import time
    cache = str(tmp_path / "c")
    url = f"s3://{bucket}/data/a.bin"
    bound = 2 * (1 << 20) + 1000
    r, _ = run(s3_environ, "cached", cache, str(bound), str(1 << 20), url, "0:100")
    assert r.stdout == DATA[:100]
    tabs = [os.path.join(cache, "o", f) for f in os.listdir(os.path.join(cache, "o"))
            if f.endswith(".tab")]
    assert len(tabs) == 1
    with open(tabs[0], "r+b") as f:  # chunk 0 last used a few seconds from now
        f.seek(64)
        f.write(struct.pack("<I", int(time.time()) + 5))
    for off in (1 << 20, 2 << 20):  # the bound passed: chunks 1 and 2 are fresh too
        r, _ = run(s3_environ, "cached", cache, str(bound), str(1 << 20), url, f"{off}:100")
        assert r.stdout == DATA[off:off + 100]
    r, st = run(s3_environ, "cached", cache, str(bound), str(1 << 20), url, "0:100")
    assert r.stdout == DATA[:100] and st["requests"] == 1
