"""Batches, states and plans of fixed configs equal the recorded hashes.

tests/golden/hashes.json was written by scripts/golden_hashes.py with the build before the
source tree was reorganized into role folders; a refactoring must not change one byte of
what the loader produces. A change that means to alter batches updates the file in the
same commit, saying why.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_batches_states_and_plans_equal_the_recorded_hashes():
    env = dict(os.environ)  # the default, fixed directory: paths are in the state
    cli = os.path.join(ROOT, "build", "polyload")
    if os.path.exists(cli):
        env["PL_CLI"] = cli
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "golden_hashes.py")],
                       env=env, capture_output=True, text=True, check=True)
    got = json.loads(p.stdout)
    with open(os.path.join(ROOT, "tests", "golden", "hashes.json")) as f:
        want = json.load(f)
    if "PL_CLI" not in env:
        want = {k: v for k, v in want.items() if not k.endswith(".plan")}
    assert got == want
