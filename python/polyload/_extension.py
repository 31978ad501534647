"""The C extension ``polyload._core``, loaded once, and :func:`_require_core`.

In a source tree without a build, ``python/polyload/_core/`` (the C sources) would import
as an empty namespace package: ``_core`` is then None and :func:`_require_core` raises
ImportError saying how to build it, so that ``import polyload`` still works (for the
pure-Python modules) where the extension is missing.
"""

from __future__ import annotations

from typing import Optional

# OpenSSL first, as Python's own hashlib loads it: the pyarrow wheel's libparquet (linked
# by the extension for Parquet sources) exports symbols of its own OpenSSL copy, which must
# not be the ones the system libcrypto binds to (see CMakeLists.txt, OpenSSL).
import hashlib  # noqa: F401,E402

try:
    from . import _core

    # In a source tree without a build, python/polyload/_core/ (the C sources) would
    # import as an empty namespace package.
    _core.Loader
    _CORE_ERROR: Optional[BaseException] = None
except (ImportError, AttributeError) as _e:  # pragma: no cover - only without a build
    _core = None  # type: ignore[assignment]
    _CORE_ERROR = _e


def _require_core():
    """The ``polyload._core`` module.

    Raises:
        ImportError: the extension is not built (the message says how to build it).
    """
    if _core is None:
        raise ImportError(
            "polyload._core (the C extension) is not built; install the package with "
            "`pip install --no-build-isolation -e .`"
        ) from _CORE_ERROR
    return _core
