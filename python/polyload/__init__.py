"""polyload: a data loader for LLM training on many sources at once.

The data path (reading, shuffling, mixing, balancing, packing, batch building) is the C
library; this package is its Python face.  Modules:

- ``polyload.prepare``: raw text -> Megatron indexed dataset (``polyload prepare``).
- ``python -m polyload ARGS``: the bundled ``polyload`` CLI (``run``, ``plan``, ``inspect``,
  ``calibrate``) and ``prepare``.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("polyload")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
