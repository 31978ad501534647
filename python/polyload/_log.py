"""The package's logger: ``logging.getLogger("polyload")``, with a NullHandler only.

Modules log under it (or a child, ``polyload.megatron``, ...); the application picks
handlers and levels as for any logger.
"""

import logging

#: The package's logger (``logging.getLogger("polyload")``); a NullHandler by default.
logger = logging.getLogger("polyload")
logger.addHandler(logging.NullHandler())
