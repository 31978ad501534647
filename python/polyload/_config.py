"""From what users pass to a checked C config: :func:`_make_config` (a YAML path, a
dict or a ``polyload._core.Config``), and the trainer's side of the topology (its rank
and world size, :func:`trainer_world_size`), against which a config is fitted."""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping, Optional, Union

from ._errors import ConfigError, ConfigWarning
from ._extension import _core, _require_core  # noqa: F401 - _core: ConfigLike
from ._log import logger

ConfigLike = Union[str, "os.PathLike[str]", Mapping[str, Any], "_core.Config"]


def _make_config(config: ConfigLike):
    """A ``_core.Config`` from a YAML path, a dict (dumped to YAML) or a Config (returned
    as it is).  Relative source paths are relative to the current directory.

    Raises:
        ConfigError: the config is invalid (the message names the key).
        PolyloadIOError: the YAML file cannot be read.
        TypeError: ``config`` is none of these.
    """
    core = _require_core()
    if isinstance(config, core.Config):
        return config
    if isinstance(config, Mapping):
        import yaml

        text = yaml.safe_dump(dict(config), sort_keys=False)
        return core.Config.parse_string(text, origin="<dict>")
    if isinstance(config, (str, bytes, os.PathLike)):
        return core.Config.parse_file(os.fsdecode(config))
    raise TypeError(f"config must be a path, a dict or a polyload._core.Config, not {type(config).__name__}")


def _default_rank() -> int:
    """torch.distributed's rank when initialized, else $RANK, else 0."""
    try:
        import torch.distributed as dist  # noqa: PLC0415 - optional and lazy

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    env = os.environ.get("RANK", "0")
    try:
        return int(env)
    except ValueError:
        raise ValueError(f"polyload: environment variable RANK={env!r} is not an integer") from None


def trainer_world_size() -> "tuple[Optional[int], Optional[str]]":
    """The trainer's world size and where it came from: ``torch.distributed``'s when a
    process group is initialized, else ``$WORLD_SIZE`` (as torchrun sets it), else
    ``(None, None)`` (one process serving whatever ranks it asks for).

    Raises:
        ValueError: ``$WORLD_SIZE`` is not a positive integer.
    """
    try:
        import torch.distributed as dist  # noqa: PLC0415 - optional and lazy

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size()), "torch.distributed.get_world_size()"
    except ImportError:
        pass
    env = os.environ.get("WORLD_SIZE")
    if env is None or env == "":
        return None, None
    try:
        n = int(env)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"polyload: environment variable WORLD_SIZE={env!r} is not a "
                         "positive integer")
    return n, "WORLD_SIZE"


def _fit_world_size(cfg) -> Optional[int]:
    """Check the config's topology against the trainer's world size, or take
    ``topology.dp: auto`` from it (``pl_config_set_world_size``).  Returns the world size
    (None when no trainer world is known).  Raises ConfigError naming both numbers."""
    world, origin = trainer_world_size()
    if world is None:
        return None
    try:
        cfg.set_world_size(world)
    except ConfigError as e:
        raise ConfigError(e.code, e.name, f"{e.message} (trainer world size from {origin})") from None
    return world


def _issue_warnings(cfg, stacklevel: int) -> None:
    """Each config warning to the ``polyload`` logger (WARNING) and as a ConfigWarning."""
    for w in cfg.warnings:
        logger.warning("config warning: %s", w)
        warnings.warn(w, ConfigWarning, stacklevel=stacklevel + 1)
