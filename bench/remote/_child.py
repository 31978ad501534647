"""One measured reader of bench/remote/compare.py, run in its own process so
that every run starts with no connection, no client and no memory of the last.

    python bench/remote/_child.py JSON
    python bench/remote/_child.py @FILE      (the JSON in a file)

JSON names the reader and its arguments; the child prints one JSON line of
figures on stdout.  Readers:
  polyload_first   polyload.Loader on a config: seconds to the first batch
  polyload_run     polyload.Loader on a config: first batch, then `steps` steps
                   (tokens/s after the first batch, tokens delivered)
  megatron         megatron-core IndexedDataset over s3:// prefixes
                   (ObjectStorageConfig: .idx downloaded to a cache, .bin read by
                   ranged GETs of bin_chunk_nbytes): the same reads as polyload's
                   plan (one list of [prefix, document, offset, count] per batch)
  streaming        MosaicML Streaming's StreamingDataset over MDS shards in the
                   bucket, with its local cache: batches of `batch` samples in
                   the dataset's order, up to `batches` or `tokens_max` tokens
"""
import json
import os
import sys
import time
import types
import warnings


def polyload_first(a):
    import polyload
    from polyload import ConfigWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        t0 = time.perf_counter()
        ld = polyload.Loader(a["config"])
        it = iter(ld)
        b = next(it)
        t1 = time.perf_counter()
        n = int(sum(v.numel() for k, v in b.items() if k == "input_ids"))
        ld.close()
    return {"first_batch_s": t1 - t0, "tokens": n}


def polyload_run(a):
    import polyload
    from polyload import ConfigWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        t0 = time.perf_counter()
        ld = polyload.Loader(a["config"])
        it = iter(ld)
        tokens = 0
        b = next(it)
        t1 = time.perf_counter()
        tokens_first = int(b["input_ids"].numel())
        for _ in range(a["batches"] - 1):
            b = next(it)
            tokens += int(b["input_ids"].numel())
        t2 = time.perf_counter()
        ld.close()
    return {"first_batch_s": t1 - t0, "seconds": t2 - t1, "tokens": tokens,
            "tokens_total": tokens + tokens_first, "tokens_per_s": tokens / (t2 - t1)}


def megatron(a):
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.object_storage_utils import ObjectStorageConfig
    conf = ObjectStorageConfig(path_to_idx_cache=a["cache"],
                               bin_chunk_nbytes=a.get("bin_chunk_nbytes", 256 << 20))
    t0 = time.perf_counter()
    ds = {}

    def get(prefix):
        d = ds.get(prefix)
        if d is None:
            d = ds[prefix] = IndexedDataset(prefix, mmap=False, object_storage_config=conf)
        return d

    if a.get("open_all"):
        for p in a["prefixes"]:
            get(p)
    first = None
    tokens = 0
    t1 = None
    for batch in a["batches"]:
        for prefix, doc, off, cnt in batch:
            x = get(prefix).get(doc, offset=off, length=cnt)
            tokens += int(np.asarray(x).size)
        if t1 is None:
            t1 = time.perf_counter()
            first = tokens
    t2 = time.perf_counter()
    rest = tokens - first
    return {"first_batch_s": t1 - t0, "seconds": t2 - t1, "tokens": rest,
            "tokens_total": tokens,
            "tokens_per_s": rest / (t2 - t1) if t2 > t1 and rest else None}


def streaming(a):
    # streaming/__init__ imports its vision datasets, which need torchvision;
    # torchvision's PyPI wheels are CUDA builds that do not load beside a CPU
    # torch, and nothing here uses them.
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import numpy as np
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    t0 = time.perf_counter()
    ds = StreamingDataset(remote=a["remote"], local=a["cache"], shuffle=False,
                          batch_size=a["batch"], cache_limit=a.get("cache_limit"),
                          predownload=a.get("predownload"))
    it = iter(ds)
    tokens = 0
    t1 = None
    first = 0
    for k in range(a["batches"]):
        try:
            for _ in range(a["batch"]):
                s = next(it)
                tokens += np.frombuffer(s["tokens"], dtype=np.uint16).size
        except StopIteration:  # the epoch's end
            break
        if t1 is None:
            t1 = time.perf_counter()
            first = tokens
        if tokens >= a.get("tokens_max", float("inf")):
            break
    t2 = time.perf_counter()
    rest = tokens - first
    return {"first_batch_s": t1 - t0, "seconds": t2 - t1, "tokens": rest,
            "tokens_total": tokens,
            "tokens_per_s": rest / (t2 - t1) if t2 > t1 and rest else None}


def main():
    arg = sys.argv[1]
    if arg.startswith("@"):  # long arguments (a plan) in a file
        with open(arg[1:]) as f:
            arg = f.read()
    a = json.loads(arg)
    out = globals()[a["reader"]](a)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # no teardown of readers' threads in the figures or the exit code


if __name__ == "__main__":
    main()
