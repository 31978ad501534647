"""Python's hashlib works after polyload is loaded.

The pyarrow wheel's libparquet, which the library links for Parquet sources, exports the
symbols of its own OpenSSL copy. When it came before the system libcrypto (linked for
libcurl) in the lookup order, libcrypto's calls to itself bound to those copies and the
first hashlib import crashed (SIGSEGV in OPENSSL_LH_doall_arg). Both the extension and
the shared library must load OpenSSL ahead of it.
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
