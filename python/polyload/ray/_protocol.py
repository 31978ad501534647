"""What travels between a deployment's data constructors and its Clients: the protocol
version (:data:`PROTOCOL`), a fetch's answer (:func:`pack_fetch`, :func:`unpack_fetch`)
and the error of a constructor that no longer serves its group (:class:`StoodDown`).
Imports no Ray."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

#: The calls between a deployment's actors and its Clients: raised when what an actor
#: call takes or answers changes (2: ``DataConstructor.fetch`` may answer a fourth
#: element, the error of the step after its packages).  A Client refuses a deployment
#: of another protocol (e.g. one launched detached by an older polyload) with
#: ConfigError at connect, instead of failing later.
PROTOCOL = 2


class StoodDown(Exception):
    """Raised by a data constructor that no longer serves its group (another one of
    the group took over: ``DataConstructor.stand_down``) for the fetches it was
    answering; the Client moves to ``serving`` (the actor name of the one that took
    over, when known), else to the group's next constructor.  Never reaches the
    trainer."""

    def __init__(self, message: str, serving: "str | None" = None) -> None:
        super().__init__(message, serving)
        self.serving = serving

    def __str__(self) -> str:
        return str(self.args[0])


def pack_fetch(out: List[Any], error: Optional[Tuple[int, str]] = None) -> Tuple[Any, ...]:
    """A fetch's answer as one buffer: ``(packages, ends, final)``, package k being
    ``packages[ends[k-1]:ends[k]]`` (uint8, ``ends`` int64 byte offsets), ``final`` the
    state blob of step train_steps when the fetch reached it (else None); with a
    fourth element ``error``, ``(code, message)``, when the step after the last package
    failed.  ``out``: the packages (uint8 arrays), then the final blob (bytes) if any.
    One Ray object with one buffer: a list of packages cost Ray ~30 % more CPU per call
    at 128 packages of 33 KB (docs/internals/decisions/0006-large-fetches-in-one-buffer.md); the copy here is ~0.1 ms
    per MB."""
    final = None
    if out and not isinstance(out[-1], np.ndarray):
        final, out = bytes(out[-1]), out[:-1]
    ends = np.cumsum([len(a) for a in out], dtype=np.int64)
    buf = out[0] if len(out) == 1 else (np.concatenate(out) if out else
                                        np.zeros(0, dtype=np.uint8))
    # the error only when there is one: a Client of protocol 1 reads three elements
    return (buf, ends, final) if error is None else (buf, ends, final, error)


def unpack_fetch(answer: Tuple[Any, ...]) -> Tuple[List[Any], Optional[bytes],
                                                   Optional[Tuple[int, str]]]:
    """``(packages, final, error)`` of :func:`pack_fetch`'s answer: the packages as
    views of its buffer (no copy), in step order."""
    buf, ends, final = answer[:3]
    error = answer[3] if len(answer) > 3 else None
    packages, start = [], 0
    for end in ends.tolist():
        packages.append(buf[start:end])
        start = end
    return packages, final, error
