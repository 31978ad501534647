"""Shared fixtures for the Python tests.

Tests import the installed ``polyload`` (``make test`` installs it into .venv); when it is
not installed, the pure-Python modules are taken from the source tree.
"""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if importlib.util.find_spec("polyload") is None:
    sys.path.insert(0, os.path.join(ROOT, "python"))
