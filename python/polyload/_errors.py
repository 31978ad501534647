"""Exceptions of polyload.

Every C status code becomes one of these through a single mapping in
``polyload._core`` (``pypl_raise`` in ``python/polyload/_core/module.c``):

=====================================================================  ====================
status codes                                                           exception
=====================================================================  ====================
EMAGIC, EVERSION, EDTYPE, ECOUNT, EBOUNDS, ETRUNC, EDOCIDX, ERECORD    FormatError
EIMAGE                                                                 FormatError
ECONFIG, ETOPOLOGY                                                     ConfigError
ESTATE                                                                 StateError
EIO, ENOENT                                                            PolyloadIOError
ERANGE                                                                 RangeError
ETIMEDOUT                                                              PolyloadTimeoutError
ELAG                                                                   LagError
EINVAL, ENOMEM, ECLOSED, others                                        PolyloadError
=====================================================================  ====================

``PolyloadIOError`` is also an :class:`OSError` (``errno`` is set: ``ENOENT`` or ``EIO``)
and ``RangeError`` is also an :class:`IndexError`, so code that catches the builtin
families keeps working.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "PolyloadError",
    "FormatError",
    "ConfigError",
    "StateError",
    "PolyloadIOError",
    "RangeError",
    "PolyloadTimeoutError",
    "LagError",
    "ConfigWarning",
]


class PolyloadError(Exception):
    """An error reported by the polyload C library.

    Attributes:
        code: the negative status code (``polyload._core.EMAGIC`` == -7, ...).
        name: the code's name without prefix, e.g. ``"EMAGIC"``.
        message: the specific story from the handle (file, record, byte offset,
            config key), e.g. ``"x_0003.idx: bad magic at offset 0, expected MMIDIDX"``.
    """

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"

    def __reduce__(self):
        return (type(self), (self.code, self.name, self.message))


class FormatError(PolyloadError):
    """A corrupt, truncated or unsupported data file (EMAGIC, EVERSION, EDTYPE, ECOUNT,
    EBOUNDS, ETRUNC, EDOCIDX, ERECORD, EIMAGE).  The message names the file, field and
    offset."""


class ConfigError(PolyloadError):
    """An invalid configuration or topology (ECONFIG, ETOPOLOGY).  The message names
    the key (and the line of a YAML file)."""


class StateError(PolyloadError):
    """A state blob that is corrupt or whose fingerprint field (seq_length,
    global_batch_size, micro_batch_size, packing, long_documents, seed, source paths)
    differs from the config (ESTATE).  The message names the field."""


class PolyloadIOError(PolyloadError, OSError):
    """A file that is missing or cannot be read (ENOENT, EIO); also an OSError with
    ``errno`` set to ``errno.ENOENT`` or ``errno.EIO``."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(code, name, message)
        self.errno = _errno.ENOENT if name == "ENOENT" else _errno.EIO
        self.strerror = message


class RangeError(PolyloadError, IndexError):
    """An index or rank out of range (ERANGE); also an IndexError."""


class PolyloadTimeoutError(PolyloadError, TimeoutError):
    """A wait passed its deadline (ETIMEDOUT); the message names the role, the actor and
    what it waited for.  Also a :class:`TimeoutError`."""


class LagError(PolyloadError):
    """This rank fell further behind its group than ``max_lag_steps`` (ELAG): its
    batches were dropped so that its peers never wait for it.  Only this rank fails."""


class ConfigWarning(UserWarning):
    """Something a config was accepted with but may not mean (``pl_config_warning``):
    weights that do not sum to 1 (normalized), a schedule point that leaves a source out,
    source weights a schedule overrides, ``seq_length`` left at its default.
    :class:`polyload.Loader` issues one per warning of its config."""
