"""Python's hashlib works after polyload is loaded.

The pyarrow wheel's libparquet, which the library links for Parquet sources, exports the
symbols of its own OpenSSL copy. When it came before the system libcrypto (linked for
libcurl) in the lookup order, libcrypto's calls to itself bound to those copies and the
first hashlib import crashed (SIGSEGV in OPENSSL_LH_doall_arg). Both the extension and
the shared library must load OpenSSL ahead of it.

The same wheel's libparquet exports its own simdjson copy (another version than the
system libsimdjson that reads JSON Lines records): calls bound to it crashed on the first
record. JSON Lines sources read their records whichever of pyarrow and polyload loads
first.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_hashlib_after_the_extension():
    p = _run("import polyload._core, hashlib; print(hashlib.sha256(b'x').hexdigest()[:8])")
    assert p.returncode == 0 and p.stdout.strip() == "2d711642", (p.returncode, p.stderr[-500:])


def test_hashlib_after_the_shared_library():
    lib = os.path.join(ROOT, "build", "libpolyload.so")
    if not os.path.exists(lib):
        pytest.skip("build/libpolyload.so not built (make build)")
    p = _run(f"import ctypes; ctypes.CDLL({lib!r}); import hashlib; "
             "print(hashlib.sha256(b'x').hexdigest()[:8])")
    assert p.returncode == 0 and p.stdout.strip() == "2d711642", (p.returncode, p.stderr[-500:])


_JSONL_READ = """
import json, os, sys, tempfile
{first}
from polyload import _core
d = tempfile.mkdtemp()
p = os.path.join(d, "r.jsonl")
with open(p, "w") as f:
    f.write(json.dumps({{"id": 1, "text": "h\u00e9llo"}}) + "\\n")
    f.write(json.dumps({{"text": "world", "m": [1, {{"a": None}}]}}) + "\\n")
cfg = {{"seq_length": 8, "global_batch_size": 1, "micro_batch_size": 1, "train_steps": 1,
       "sources": [{{"name": "r", "type": "jsonl", "path": p,
                    "tokenizer": {{"type": "bytes"}}}}]}}
src = _core.Config.parse_string(json.dumps(cfg)).open_source(0)
import numpy as np
print([np.asarray(src.read(i)).tolist() for i in range(src.num_documents)])
"""


@pytest.mark.parametrize("first", ["import pyarrow.parquet, pyarrow.json", "import hashlib"])
def test_jsonl_records_whichever_loads_first(first):
    p = _run(_JSONL_READ.format(first=first))
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    docs = eval(p.stdout.strip())  # noqa: S307  our own subprocess's list of lists
    eos = docs[0][-1]
    assert docs == [list("h\u00e9llo".encode()) + [eos], list(b"world") + [eos]]
