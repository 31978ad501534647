"""Calling actors: a wait with a deadline (:func:`get`), polyload's own exceptions
unwrapped from Ray's (:func:`unwrap`, :func:`error_parts`), and telling a lost actor
from an error it raised (:func:`actor_lost`).  Ray is imported when first needed."""

from __future__ import annotations

from typing import Tuple

import polyload
from polyload import _core


def unwrap(exc: BaseException) -> BaseException:
    """The exception an actor raised, without Ray's ``RayTaskError`` wrappers, so the
    trainer sees ``polyload.FormatError`` etc. as the embedded loader raises them."""
    from ray.exceptions import RayTaskError  # noqa: PLC0415

    seen = 0
    while isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None and seen < 16:
        exc = exc.cause
        seen += 1
    return exc


def actor_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says that an actor's process is gone or unreachable (killed,
    crashed, its node lost, restarting), rather than an error the actor raised."""
    import ray.exceptions as rex  # noqa: PLC0415

    kinds = tuple(k for k in (getattr(rex, n, None) for n in (
        "RayActorError", "ActorDiedError", "ActorUnavailableError", "OwnerDiedError",
        "ObjectLostError", "ObjectReconstructionFailedError", "NodeDiedError",
        "WorkerCrashedError", "LocalRayletDiedError")) if isinstance(k, type))
    return isinstance(exc, kinds)


def get(refs, timeout=None):
    """``ray.get`` with a deadline: polyload's own exceptions unwrapped from Ray's, and
    a timeout as PolyloadTimeoutError."""
    import ray  # noqa: PLC0415

    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise polyload.PolyloadTimeoutError(
            polyload._core.ETIMEDOUT, "ETIMEDOUT",
            f"polyload.ray: no answer from the deployment's actors within {timeout:g} s "
            f"({refs!r})") from None
    except Exception as e:  # noqa: BLE001 - polyload's own exception, unwrapped
        raise unwrap(e) from None


def error_parts(exc: BaseException) -> Tuple[int, str]:
    """(status code, message) of an exception, for a pipeline failure: polyload's own
    errors keep their code and message; anything else becomes EIO naming its type."""
    exc = unwrap(exc)
    if isinstance(exc, polyload.PolyloadError):
        return exc.code, exc.message
    return _core.EIO, f"{type(exc).__name__}: {exc}"


def node_id() -> str:
    """The Ray node id of this process (an actor's)."""
    import ray  # noqa: PLC0415

    return ray.get_runtime_context().get_node_id()
