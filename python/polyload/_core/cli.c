/*
 * cli.c -- the C CLI (cli/polyload.c) inside the Python extension, for
 * configs whose tokenizers only Python provides (type hf, tiktoken): the
 * `polyload` binary has no Python, so `python -m polyload run|plan|index`
 * runs the same code here, with every config it parses given the package's
 * tokenizer factory.  Output and exit codes are the binary's.
 */
#include "core.h"

#define main pl__cli_main
#include "../../../cli/polyload.c"
#undef main

static void pypl_cli_hook(pl_config *cfg) {
    pl_config_set_tokenizer_factory_spec(cfg, pypl_tokenizer_factory, NULL);
}

PyObject *pypl_cli_main(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!:cli_main", &PyList_Type, &list)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    char **argv = calloc((size_t)n + 2, sizeof *argv);
    if (!argv) return PyErr_NoMemory();
    argv[0] = "polyload";
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
        if (!s) {
            free(argv);
            return NULL;
        }
        argv[i + 1] = (char *)s;
    }
    cli_config_hook = pypl_cli_hook;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl__cli_main((int)n + 1, argv);
    fflush(stdout);
    fflush(stderr);
    Py_END_ALLOW_THREADS
    free(argv);
    return PyLong_FromLong(rc);
}
