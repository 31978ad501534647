"""polyload: a data loader for LLM training on many sources at once.

The data path (reading, shuffling, mixing, balancing, packing, batch building) is the C
library; this package is its Python face.  Modules:

- ``polyload.Loader``: the embedded loader as a Python iterator of micro-batches (SPEC 7);
  its home is :mod:`polyload.loader`.
- ``polyload._core``: the C API one to one (``Config``, ``Source``, ``Planner``,
  ``Loader``, ``Batch``, ``Array``), a CPython extension written in C.
- ``polyload.torch``: PyTorch helpers (``broadcast_tp``: the Megatron pattern where TP
  rank 0 reads and broadcasts over the TP process group).
- ``polyload.megatron``: Megatron-LM's ``--dataloader-type external`` (batches under
  Megatron's names, ``PackedSeqParams``, argument check, checkpointed state).
- ``polyload.hf``: Hugging Face transformers causal-LM fields for packed batches
  (unshifted labels or ``shift_labels``, ``position_ids``, FlashAttention varlen kwargs).
- ``polyload.prepare``: raw text -> Megatron indexed dataset (``polyload prepare``).
- ``python -m polyload ARGS``: the bundled ``polyload`` CLI (``run``, ``plan``, ``inspect``,
  ``calibrate``) and ``prepare``.

Errors are :class:`PolyloadError` and its subclasses (:class:`FormatError`,
:class:`ConfigError`, :class:`StateError`, :class:`PolyloadIOError`,
:class:`RangeError`), with ``.code``, ``.name`` and ``.message``.

PyTorch is optional and imported lazily: without it, :class:`Loader` yields read-only NumPy
arrays (zero-copy views of the C memory) instead of tensors.

Logging: the package logs through :mod:`logging` under the logger ``"polyload"`` (its
children ``polyload.megatron``, ...): the config's warnings at WARNING (also issued as
:class:`ConfigWarning`), what a Loader serves, state loads and evaluation passes at INFO.
The library adds only a ``NullHandler``; configure handlers and levels as for any logger.
"""


# This module is the package's face: it re-exports the public names from the modules
# that hold them (Loader: loader.py; configs and the trainer's world: _config.py;
# errors: _errors.py; the C extension: _extension.py; the logger: _log.py).

from importlib import metadata as _metadata

# _core, _make_config, _require_core, _state_blob and logger are private: polyload.hf,
# polyload.megatron, polyload.report, the benchmarks and the tests reach them here.
from ._config import _make_config, trainer_world_size  # noqa: F401
from ._errors import (
    ConfigError,
    ConfigWarning,
    FormatError,
    LagError,
    PolyloadError,
    PolyloadIOError,
    PolyloadTimeoutError,
    RangeError,
    StateError,
)
from ._extension import _core, _require_core  # noqa: F401
from ._log import logger  # noqa: F401
from .loader import STATE_VERSION, Loader, _state_blob, eval_loader  # noqa: F401

try:
    __version__ = _metadata.version("polyload")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    "Loader",
    "STATE_VERSION",
    "PolyloadError",
    "FormatError",
    "ConfigError",
    "StateError",
    "PolyloadIOError",
    "PolyloadTimeoutError",
    "LagError",
    "RangeError",
    "ConfigWarning",
    "trainer_world_size",
    "eval_loader",
]
