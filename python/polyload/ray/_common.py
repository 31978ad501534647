"""Pieces shared by the actors, the deployment and the client of :mod:`polyload.ray`.

Nothing here imports Ray at module level except :func:`unwrap`, which imports it lazily.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any, Dict, Mapping, Tuple

import polyload
from polyload import _errors

#: Offsets into the state blob (src/state.c): next step, micro-batch cursor, dp.
_STEP_OFF, _MB_OFF, _DP_OFF = 24, 32, 40


def config_payload(config) -> Tuple[str, Any, str]:
    """What an actor needs to rebuild the config in its own process: ``("yaml", text,
    origin)`` for a path, ``("dict", dict, "<dict>")`` for a mapping.  C handles
    (``polyload._core.Config``) are never pickled."""
    if isinstance(config, Mapping):
        return ("dict", dict(config), "<dict>")
    if isinstance(config, (str, bytes, os.PathLike)):
        path = os.fsdecode(config)
        with open(path, "r", encoding="utf-8") as f:
            return ("yaml", f.read(), path)
    raise TypeError(
        "polyload.ray needs the config as a YAML path or a dict (a polyload._core.Config "
        f"cannot travel to other processes), not {type(config).__name__}"
    )


def make_config(payload):
    """A ``polyload._core.Config`` from :func:`config_payload`'s tuple."""
    kind, value, origin = payload
    if kind == "dict":
        return polyload._make_config(value)
    return polyload._core.Config.parse_string(value, origin=origin)


def enter_cwd(cwd: str) -> None:
    """Relative source paths are relative to the current directory of the process that
    launched the deployment (as for the embedded loader); actors work from there when
    the directory exists on their node, so the state blob's source paths are the same."""
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)


def blob_position(blob: bytes) -> Tuple[int, int, int]:
    """(next step, micro-batch cursor, dp) of a state blob (SPEC section 4)."""
    if len(blob) < 52 or blob[:4] != b"PLST":
        raise _errors.StateError(polyload._core.ESTATE, "ESTATE", "state: not a polyload state blob")
    step, mb, dp = struct.unpack_from("<qqq", blob, _STEP_OFF)
    return step, mb, dp


def blob_at(blob: bytes, mb: int, dp: int) -> bytes:
    """The blob of a step's start with the micro-batch cursor set to ``mb`` and the CRC
    resealed: what ``pl_loader_get_state`` returns mid-step (src/loader.c)."""
    b = bytearray(blob)
    struct.pack_into("<qq", b, _MB_OFF, mb, dp)
    struct.pack_into("<I", b, len(b) - 4, zlib.crc32(bytes(b[:-4])) & 0xFFFFFFFF)
    return bytes(b)


def blob_sources(blob: bytes) -> Dict[str, Dict[str, float]]:
    """Per source counters of a state blob (layout in src/state.c), for ``stats()``."""
    off = 96  # magic .. mixture hash
    (n,) = struct.unpack_from("<I", blob, off)
    off += 4
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", blob, off)
        name = blob[off + 4: off + 4 + ln].decode()
        off += 4 + ln
        (lp,) = struct.unpack_from("<I", blob, off)
        off += 4 + lp
        (_docs, epoch, _die, _ci, _co, _cl, drawn) = struct.unpack_from("<7q", blob, off)
        off += 56
        (target,) = struct.unpack_from("<d", blob, off)
        off += 8
        (documents, _since, skipped) = struct.unpack_from("<3q", blob, off)
        off += 24
        out[name] = {"epoch": epoch, "drawn": drawn, "target": target,
                     "documents": documents, "skipped": skipped}
    return out


def unwrap(exc: BaseException) -> BaseException:
    """The exception an actor raised, without Ray's ``RayTaskError`` wrappers, so the
    trainer sees ``polyload.FormatError`` etc. as the embedded loader raises them."""
    from ray.exceptions import RayTaskError  # noqa: PLC0415

    seen = 0
    while isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None and seen < 16:
        exc = exc.cause
        seen += 1
    return exc


def stale_error(message: str) -> BaseException:
    return _errors.StateError(polyload._core.ESTATE, "ESTATE", message)
