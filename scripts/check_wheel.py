"""Run inside a fresh virtual environment that has only the polyload wheel (and its PyPI
dependencies) installed: checks that the wheel works without the source tree, the C build
tree or any -dev package.

- every library ``_core`` and the bundled CLI need resolves: libyaml, xxhash and zlib are
  linked in statically, the codecs, Jansson, libzstd and SentencePiece are bundled by
  auditwheel (``polyload.libs``), the rest is what the manylinux policy lets the system
  provide;
- a Megatron indexed dataset written here with NumPy (the format of docs/reference/formats.md)
  reads back through ``polyload.Loader`` with exact values, and a config with a
  validation split runs an evaluation pass;
- the ``polyload`` console script (the bundled C CLI) inspects it.

Exit status 0 when every check passes; a message naming the failed check otherwise.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

import polyload
from polyload import _core

here = os.path.dirname(os.path.abspath(polyload.__file__))
assert not here.startswith(os.environ.get("POLYLOAD_SOURCE_TREE", "\0")), \
    f"polyload imported from the source tree ({here}), not from the wheel"

# 1. Shared-library dependencies: every library resolves, and none comes from a -dev
# package's build tree: each is libc's, bundled in the wheel by auditwheel (polyload.libs,
# hashed names), or one that auditwheel's manylinux policy allows the system to provide.
libs_dir = os.path.realpath(os.path.join(os.path.dirname(here), "polyload.libs"))
for path in [_core.__file__, os.path.join(here, "bin", "polyload")]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if "=>" in ln]
    missing = [ln for ln in lines if "not found" in ln]
    assert not missing, f"{path}: unresolved at run time: {missing}"
    resolved = {ln.split()[0]: os.path.realpath(ln.split("=>")[1].split()[0]) for ln in lines}
    bundled = sorted(n for n, where in resolved.items() if where.startswith(libs_dir))
    system = sorted(n for n, where in resolved.items() if not where.startswith(libs_dir))
    print(f"ok: {os.path.basename(path)}: {len(bundled)} libraries bundled in the wheel, "
          f"from the system {system}")

# 2. A Megatron dataset written with NumPy, read through the Loader.
d = tempfile.mkdtemp()
prefix = os.path.join(d, "web_text_document")
lengths = np.array([5, 9, 3, 40, 7, 12, 2, 30, 8, 6] * 10, dtype=np.int64)
starts = np.concatenate([[0], np.cumsum(lengths)])
(1000 + np.arange(starts[-1], dtype=np.int32)).tofile(prefix + ".bin")
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(lengths), len(lengths) + 1))
    f.write(lengths.astype(np.int32).tobytes())
    f.write((starts[:-1] * 4).astype(np.int64).tobytes())
    f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
cfg = {"seed": 1, "seq_length": 32, "global_batch_size": 4, "micro_batch_size": 2,
       "train_steps": 3, "pad_id": 0, "split": "90,10,0", "topology": {"dp": 1},
       "sources": [{"name": "web", "type": "megatron", "path": prefix, "weight": 1.0}]}
n = 0
with polyload.Loader(cfg, rank=0) as loader:
    for b in loader:
        ids, lab, mask = (np.asarray(b[k]) for k in ("input_ids", "labels", "loss_mask"))
        real = ids != 0
        assert ((ids[real] >= 1000) & (ids[real] < 1000 + starts[-1])).all()
        # labels are the next token within a document (token value == position + 1000)
        m = mask > 0
        assert (lab[m] == ids[m] + 1).all()
        n += 1
assert n == 3 * 2, n
with polyload.eval_loader(cfg, "valid", rank=0) as ev:
    tokens = sum(int((np.asarray(b["input_ids"]) != 0).sum()) for b in ev)
lo, hi = round(0.9 * len(lengths)), len(lengths)
assert tokens == int(lengths[lo:hi].sum()), tokens
print(f"ok: Loader read {n} micro-batches; the validation pass {tokens} tokens")

# 3. The console script (the bundled C CLI).
exe = os.path.join(os.path.dirname(sys.executable), "polyload")
r = subprocess.run([exe, "inspect", prefix, "--json"], capture_output=True, text=True)
assert r.returncode == 0, r.stderr
info = json.loads(r.stdout)
assert info["documents"] == len(lengths) and info["tokens"] == int(starts[-1]), info
print(f"ok: polyload inspect: {info['documents']} documents, {info['tokens']} tokens")
print(f"polyload {polyload.__version__} from {here}: all checks passed")
