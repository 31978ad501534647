/*
 * state.c -- module functions over state blobs (pl_state_inspect,
 * pl_state_source, retarget, pack/unpack) and packages (pl_package_inspect).
 */
#include "core.h"

#include <string.h>

/* ================================================== module-level helpers */

/* state_info(blob) -> dict (pl_state_inspect + pl_state_source). */
PyObject *pypl_state_info(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    pl_state_info si;
    int rc = pl_state_inspect(v.buf, (size_t)v.len, &si);
    if (rc != PL_OK) {
        PyBuffer_Release(&v);
        return pypl_raise(rc == PL_EVERSION ? PL_ESTATE : rc,
                          rc == PL_EVERSION ? "state: a blob of another format version"
                                            : "state: not a valid polyload state blob");
    }
    PyObject *srcs = PyList_New(0);
    for (int64_t i = 0; srcs && i < si.n_sources; i++) {
        pl_state_source_info s;
        if (pl_state_source(v.buf, (size_t)v.len, i, &s) != PL_OK) break;
        PyObject *e = Py_BuildValue(
            "{s:s#,s:s#,s:L,s:L,s:L,s:L,s:L,s:d,s:L,s:L}", "name", s.name,
            (Py_ssize_t)s.name_len, "path", s.path, (Py_ssize_t)s.path_len, "num_documents",
            (long long)s.num_documents, "epoch", (long long)s.epoch, "drawn_in_epoch",
            (long long)s.drawn_in_epoch, "current_document", (long long)s.current_document,
            "drawn_tokens", (long long)s.drawn_tokens, "target_tokens", s.target_tokens,
            "documents", (long long)s.documents, "skipped", (long long)s.skipped);
        if (!e || PyList_Append(srcs, e) < 0) {
            Py_XDECREF(e);
            Py_CLEAR(srcs);
            break;
        }
        Py_DECREF(e);
    }
    PyBuffer_Release(&v);
    if (!srcs) return NULL;
    return Py_BuildValue("{s:I,s:K,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:N}", "version",
                         si.version, "seed", (unsigned long long)si.seed, "step",
                         (long long)si.step, "micro_batch", (long long)si.micro_batch, "dp",
                         (long long)si.dp, "seq_length", (long long)si.seq_length,
                         "global_batch_size", (long long)si.global_batch_size,
                         "micro_batch_size", (long long)si.micro_batch_size, "cp",
                         (long long)si.cp, "carried_chunks", (long long)si.carried_chunks,
                         "sources", srcs);
}

/* state_retarget(blob, micro_batch, dp) -> bytes. */
PyObject *pypl_state_retarget(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer v;
    long long mb, dp;
    if (!PyArg_ParseTuple(args, "y*LL:state_retarget", &v, &mb, &dp)) return NULL;
    PyObject *b = PyBytes_FromStringAndSize(NULL, v.len);
    int rc = b ? pl_state_retarget(v.buf, (size_t)v.len, mb, dp, PyBytes_AS_STRING(b),
                                   (size_t)v.len, NULL)
               : PL_ENOMEM;
    PyBuffer_Release(&v);
    if (rc != PL_OK) {
        Py_XDECREF(b);
        return pypl_raise(PL_ESTATE, "state: not a valid blob, or a negative cursor");
    }
    return b;
}

/* state_pack(blob) -> bytes (pl_state_pack). */
PyObject *pypl_state_pack(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    size_t bound = 0, n = 0;
    int rc = pl_state_pack(v.buf, (size_t)v.len, NULL, 0, &bound);
    PyObject *b = rc == PL_OK ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound) : NULL;
    if (b) {
        Py_BEGIN_ALLOW_THREADS
        rc = pl_state_pack(v.buf, (size_t)v.len, PyBytes_AS_STRING(b), bound, &n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&v);
    if (rc != PL_OK) {
        Py_XDECREF(b);
        return pypl_raise(rc == PL_EVERSION ? PL_ESTATE : rc,
                          "state_pack: not a valid polyload state blob");
    }
    if (!b) return NULL;
    if (_PyBytes_Resize(&b, (Py_ssize_t)n) < 0) return NULL;
    return b;
}

/* state_unpack(packed) -> bytes (pl_state_unpack). */
PyObject *pypl_state_unpack(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    size_t n = 0;
    int rc = pl_state_unpack(v.buf, (size_t)v.len, NULL, 0, &n);
    PyObject *b = rc == PL_OK ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n) : NULL;
    if (b) {
        Py_BEGIN_ALLOW_THREADS
        rc = pl_state_unpack(v.buf, (size_t)v.len, PyBytes_AS_STRING(b), n, &n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&v);
    if (rc != PL_OK) {
        Py_XDECREF(b);
        return pypl_raise(rc, "state_unpack: a corrupt or truncated packed state");
    }
    return b;
}

/* package_info(bytes) -> (step, dp_rank). */
PyObject *pypl_package_info(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    int64_t step = 0, dp = 0;
    int rc = pl_package_inspect(v.buf, (size_t)v.len, &step, &dp);
    PyBuffer_Release(&v);
    if (rc != PL_OK) return pypl_raise(PL_EINVAL, "package: corrupt");
    return Py_BuildValue("(LL)", (long long)step, (long long)dp);
}
