"""``python -m polyload ARGS``: run the bundled C CLI, or ``prepare`` in Python.

``prepare`` (text -> Megatron indexed dataset, tokenizer training) is handled by
:mod:`polyload.prepare`, ``report`` (a picture of the plan) by :mod:`polyload.report`, ``serve`` (a Ray deployment) by :mod:`polyload.ray.serve` and ``top`` (its live scaling view) by :mod:`polyload.ray.top`; every other command (``run``, ``plan``, ``inspect``, ``calibrate``,
``--help``) replaces this process with the ``polyload`` binary installed in
``polyload/bin/``, so exit codes and output are the CLI's own.
"""

import os
import sys


def cli_path():
    """Path of the bundled ``polyload`` binary, or None when it is not installed.

    ``POLYLOAD_CLI`` overrides the search (e.g. to run a binary from ``build/``).
    """
    override = os.environ.get("POLYLOAD_CLI")
    if override:
        return override
    candidates = []
    try:  # works for wheels and for scikit-build-core's editable redirects
        from importlib.resources import files

        candidates.append(os.fspath(files("polyload") / "bin" / "polyload"))
    except (ImportError, TypeError, FileNotFoundError):
        pass
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "polyload"))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prepare":
        from polyload import prepare

        return prepare.main(argv[1:])
    if argv and argv[0] == "report":
        from polyload import report

        return report.main(argv[1:])
    if argv and argv[0] == "serve":
        from polyload.ray.serve import serve

        return serve(argv[1:])
    if argv and argv[0] == "top":
        from polyload.ray.top import top

        return top(argv[1:])
    path = cli_path()
    if path is None:
        sys.stderr.write(
            "polyload: the bundled CLI binary (polyload/bin/polyload) is not installed; "
            "reinstall the package or set POLYLOAD_CLI\n"
        )
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["polyload"] + argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
