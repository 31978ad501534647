"""``python -m polyload ARGS``: run the bundled C CLI, or ``prepare`` in Python.

``prepare`` (text -> Megatron indexed dataset, tokenizer training) is handled by
:mod:`polyload.prepare`, ``check`` (a pre-flight pass over a config's data) by
:mod:`polyload.check`, ``report`` (a picture of the plan) by :mod:`polyload.report`,
``serve`` (a Ray deployment) by :mod:`polyload.ray.serve` and ``top`` (its live scaling
view) by :mod:`polyload.ray.top`; ``report``, ``serve`` and ``top`` say in one line which
extra (``polyload[report]``, ``polyload[ray]``) to install when its module is missing.
``run``, ``plan`` and ``index`` of a config with an ``hf`` or ``tiktoken`` tokenizer run
the CLI's code in this process (``polyload._core.cli_main``), since the binary has no
Python to host them.  Every other command (``run``, ``plan``, ``inspect``, ``calibrate``)
replaces this process with the ``polyload`` binary installed in ``polyload/bin/``, so exit
codes and output are the CLI's own; ``--help`` adds the Python package's commands to the
binary's list.
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


# Commands that live in the Python package, with the extra each needs ("" for none).
PYTHON_COMMANDS = {
    "prepare": ("Tokenize text into Megatron sources; train a tokenizer", ""),
    "check": ("CONFIG: parse every record of every source before a run, with a "
              "summary of problems by file and line", ""),
    "report": ("CONFIG --steps A:B [--out F]: a picture of the plan (cost per rank)",
               "report"),
    "serve": ("CONFIG --ray-address ADDR: run a Ray deployment until interrupted", "ray"),
    "top": ("--ray-address ADDR: a live view of a deployment's scaling", "ray"),
}
# The modules each extra provides.
_EXTRA_MODULES = {"report": ("matplotlib",), "ray": ("ray",)}
# Tokenizer types only the Python package provides.
_PY_TOKENIZERS = ("hf", "tiktoken")


def _missing_extra(cmd, argv):
    """A one-line message when the command needs an extra that is not installed."""
    extra = PYTHON_COMMANDS.get(cmd, ("", ""))[1]
    if not extra or (cmd == "report" and "--out" not in argv and
                     not any(a.startswith("--out=") for a in argv)):
        return None  # report without --out writes no picture: no matplotlib
    import importlib.util

    for mod in _EXTRA_MODULES[extra]:
        if importlib.util.find_spec(mod) is None:
            return (f"polyload: {cmd} needs {mod}, which is not installed; install it with "
                    f"pip install 'polyload[{extra}]'\n")
    return None


def _needs_python_tokenizer(argv):
    """Does the config of ``run``/``plan``/``index`` use a tokenizer only Python has?"""
    if len(argv) < 2 or argv[0] not in ("run", "plan", "index"):
        return False
    path = next((a for a in argv[1:] if not a.startswith("-")), None)
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except Exception:  # noqa: BLE001 - the CLI reports an unreadable config itself
        return False

    def walk(node):
        if isinstance(node, dict):
            t = node.get("tokenizer")
            if isinstance(t, dict) and t.get("type") in _PY_TOKENIZERS:
                return True
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(doc)


def _help_text(binary_help):
    return binary_help.rstrip("\n") + (
        "\nrun, plan and index of a config with an hf or tiktoken tokenizer run in the Python "
        "package (python -m polyload, or the installed polyload command).\n")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("report", "serve", "top"):
        msg = _missing_extra(argv[0], argv[1:])
        if msg:
            sys.stderr.write(msg)
            return 1
    if argv and argv[0] == "check":
        from polyload import check

        return check.main(argv[1:])
    if not argv or argv[0] in ("help", "--help", "-h"):
        path = cli_path()
        if path is not None:
            import subprocess

            r = subprocess.run([path, "--help"], capture_output=True, text=True)
            sys.stdout.write(_help_text(r.stdout))
            return 0 if argv else 2
    if (len(argv) > 1 and argv[0] == "inspect" and
            argv[1].endswith((".yaml", ".yml", ".json"))):
        from polyload import check

        return check.inspect_config(argv[1:])
    if _needs_python_tokenizer(argv):
        # The binary has no Python to host these tokenizers: run the same CLI code in
        # this process (polyload._core.cli_main), Ctrl-C ending it as it ends the binary.
        import signal

        from polyload import _core

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        return _core.cli_main(argv)
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
