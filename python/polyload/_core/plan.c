/*
 * plan.c -- Plan (pl_plan): encode/decode, the reads of a micro-batch, the
 * plan as a dict (Planner.next).
 *
 * Read lists cross the Python boundary as int64 arrays of shape [n, 4] with
 * columns (source, index, offset, count), the fields of pl_read.
 */
#include "core.h"

#include <string.h>

/* ---------------------------------------------------------------- Plan */

PyObject *pypl_plan_wrap(pl_plan *pl) {
    PyPlPlan *o = PyObject_New(PyPlPlan, &PyPl_PlanType);
    if (!o) {
        pl_plan_free(pl);
        return NULL;
    }
    o->plan = pl;
    return (PyObject *)o;
}

static void plan_dealloc(PyPlPlan *o) {
    pl_plan_free(o->plan);
    PyObject_Free(o);
}

static PyObject *plan_decode(PyTypeObject *cls, PyObject *arg) {
    (void)cls;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    pl_plan *pl = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_plan_decode(view.buf, (size_t)view.len, &pl);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc != PL_OK) return pypl_raise(rc, "plan: corrupt or truncated encoding");
    return pypl_plan_wrap(pl);
}

static PyObject *plan_encode(PyPlPlan *o, PyObject *unused) {
    (void)unused;
    size_t n = 0;
    int rc = pl_plan_encode(o->plan, NULL, 0, &n);
    if (rc != PL_OK) return pypl_raise(rc, "plan: cannot encode");
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!b) return NULL;
    char *buf = PyBytes_AS_STRING(b);
    Py_BEGIN_ALLOW_THREADS
    rc = pl_plan_encode(o->plan, buf, n, &n);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        Py_DECREF(b);
        return pypl_raise(rc, "plan: cannot encode");
    }
    return b;
}

static PyObject *plan_reads(PyPlPlan *o, PyObject *args) {
    long long dp_rank, mb;
    if (!PyArg_ParseTuple(args, "LL:reads", &dp_rank, &mb)) return NULL;
    int64_t n = 0;
    int rc = pl_plan_reads(o->plan, dp_rank, mb, NULL, 0, &n);
    if (rc != PL_OK && rc != PL_EINVAL) {
        char msg[128];
        snprintf(msg, sizeof msg, "plan: dp_rank %lld / micro_batch %lld out of range",
                 dp_rank, mb);
        return pypl_raise(rc, msg);
    }
    pl_read *r = PyMem_Calloc((size_t)(n ? n : 1), sizeof *r);
    int64_t *out = malloc((size_t)(n ? n : 1) * 4 * sizeof(int64_t));
    if (!r || !out) {
        PyMem_Free(r);
        free(out);
        return PyErr_NoMemory();
    }
    rc = pl_plan_reads(o->plan, dp_rank, mb, r, n, &n);
    if (rc != PL_OK) {
        PyMem_Free(r);
        free(out);
        return pypl_raise(rc, "plan: reads");
    }
    for (int64_t i = 0; i < n; i++) {
        out[i * 4 + 0] = r[i].source;
        out[i * 4 + 1] = r[i].index;
        out[i * 4 + 2] = r[i].offset;
        out[i * 4 + 3] = r[i].count;
    }
    PyMem_Free(r);
    Py_ssize_t shape[2] = {(Py_ssize_t)n, 4};
    return pypl_array_owned(out, "q", 8, 2, shape);
}

static PyObject *plan_to_dict(PyPlPlan *o, PyObject *unused) {
    (void)unused;
    return pypl_plan_to_dict(o->plan);
}

#define PLAN_INT_GETTER(field)                                                  \
    static PyObject *plan_get_##field(PyPlPlan *o, void *c) {                   \
        (void)c;                                                                \
        return PyLong_FromLongLong((long long)o->plan->field);                  \
    }
PLAN_INT_GETTER(step)
PLAN_INT_GETTER(dp)
PLAN_INT_GETTER(global_batch_size)
PLAN_INT_GETTER(micro_batch_size)
PLAN_INT_GETTER(micro_batches_per_rank)
PLAN_INT_GETTER(seq_length)
PLAN_INT_GETTER(n_chunks)
PLAN_INT_GETTER(tokens)

static PyMethodDef plan_methods[] = {
    {"decode", (PyCFunction)plan_decode, METH_O | METH_CLASS,
     "Plan.decode(blob) -> Plan\n\nRebuild a plan from encode()'s bytes.  PolyloadError "
     "EINVAL if corrupt."},
    {"encode", (PyCFunction)plan_encode, METH_NOARGS,
     "encode() -> bytes\n\nA versioned, checksummed encoding ('PLPN') to send the plan."},
    {"reads", (PyCFunction)plan_reads, METH_VARARGS,
     "reads(dp_rank, micro_batch) -> Array [n, 4] int64\n\nThe token ranges (source, "
     "index, offset, count) the micro-batch needs, in the\norder Constructor.build takes "
     "their payloads.  RangeError for a bad rank or micro-batch."},
    {"to_dict", (PyCFunction)plan_to_dict, METH_NOARGS,
     "to_dict() -> dict\n\nThe plan's fields and arrays, as Planner.next() returns them."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"step", (getter)plan_get_step, NULL, "int", NULL},
    {"dp", (getter)plan_get_dp, NULL, "int", NULL},
    {"global_batch_size", (getter)plan_get_global_batch_size, NULL, "int", NULL},
    {"micro_batch_size", (getter)plan_get_micro_batch_size, NULL, "int", NULL},
    {"micro_batches_per_rank", (getter)plan_get_micro_batches_per_rank, NULL, "int", NULL},
    {"seq_length", (getter)plan_get_seq_length, NULL, "int", NULL},
    {"n_chunks", (getter)plan_get_n_chunks, NULL, "int", NULL},
    {"tokens", (getter)plan_get_tokens, NULL, "int: non-padding tokens of the step", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyPl_PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Plan",
    .tp_basicsize = sizeof(PyPlPlan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The plan of one step (pl_plan).  From Planner.next_plan() or Plan.decode();\n"
              "not picklable: send encode()'s bytes instead.",
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
};


/* Copy n elements of `es` bytes into a new owned Array. */
static PyObject *owned_copy(const void *src, Py_ssize_t n, Py_ssize_t cols,
                            const char *format, Py_ssize_t es) {
    size_t bytes = (size_t)(n * (cols ? cols : 1)) * (size_t)es;
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) return PyErr_NoMemory();
    if (bytes) memcpy(buf, src, bytes);
    Py_ssize_t shape[2] = {n, cols};
    return pypl_array_owned(buf, format, es, cols ? 2 : 1, shape);
}

PyObject *pypl_plan_to_dict(const pl_plan *pl) {
    PyObject *d = Py_BuildValue(
        "{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d}", "step", (long long)pl->step, "dp",
        (long long)pl->dp, "global_batch_size", (long long)pl->global_batch_size,
        "micro_batch_size", (long long)pl->micro_batch_size, "micro_batches_per_rank",
        (long long)pl->micro_batches_per_rank, "seq_length", (long long)pl->seq_length,
        "n_sequences", (long long)pl->n_sequences, "n_chunks", (long long)pl->n_chunks,
        "tokens", (long long)pl->tokens, "lower_bound", pl->lower_bound);
    if (!d) return NULL;
    /* chunks: [n_chunks, 5] int64, columns (source, index, offset, length, flags) */
    Py_ssize_t nc = (Py_ssize_t)pl->n_chunks;
    int64_t *ch = malloc((size_t)(nc ? nc : 1) * 5 * sizeof(int64_t));
    if (!ch) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nc; i++) {
        ch[i * 5 + 0] = pl->chunks[i].source;
        ch[i * 5 + 1] = pl->chunks[i].index;
        ch[i * 5 + 2] = pl->chunks[i].offset;
        ch[i * 5 + 3] = pl->chunks[i].length;
        ch[i * 5 + 4] = pl->chunks[i].flags;
    }
    Py_ssize_t shape[2] = {nc, 5};
    Py_ssize_t nq = (Py_ssize_t)pl->n_sequences;
    if (pypl_dict_steal(d, "chunks", pypl_array_owned(ch, "q", 8, 2, shape)) ||
        pypl_dict_steal(d, "seq_offsets", owned_copy(pl->seq_offsets, nq + 1, 0, "q", 8)) ||
        pypl_dict_steal(d, "seq_tokens", owned_copy(pl->seq_tokens, nq, 0, "q", 8)) ||
        pypl_dict_steal(d, "seq_cost", owned_copy(pl->seq_cost, nq, 0, "d", 8)) ||
        pypl_dict_steal(d, "rank_sequences", owned_copy(pl->rank_sequences, nq, 0, "q", 8)) ||
        pypl_dict_steal(d, "rank_cost",
                        owned_copy(pl->rank_cost, (Py_ssize_t)pl->dp, 0, "d", 8))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
