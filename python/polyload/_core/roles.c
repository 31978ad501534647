/*
 * roles.c -- the roles of the embedded loader one by one, for deployments that
 * put them in different processes (polyload.ray): Plan (pl_plan, with
 * encode/decode and the reads of a micro-batch) and Constructor
 * (pl_constructor).  Source.read_many lives here too.
 *
 * Read lists cross the Python boundary as int64 arrays of shape [n, 4] with
 * columns (source, index, offset, count), the fields of pl_read.
 */
#include "core.h"

#include <string.h>

/* ---------------------------------------------------------------- Plan */

typedef struct {
    PyObject_HEAD
    pl_plan *plan;
} PyPlPlan;

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

/* --------------------------------------------------------- Constructor */

typedef struct {
    PyObject_HEAD
    pl_constructor *c;
    int busy;
} PyPlConstructor;

static PyObject *ctor_create(PyTypeObject *cls, PyObject *arg) {
    (void)cls;
    if (!PyObject_TypeCheck(arg, &PyPl_ConfigType)) {
        PyErr_SetString(PyExc_TypeError, "Constructor.create: expected a Config");
        return NULL;
    }
    PyPlConfig *cfg = (PyPlConfig *)arg;
    pl_constructor *c = NULL;
    pl_config *shared = pypl_config_shared(cfg);
    int rc = pl_constructor_create(shared, &c);
    if (rc != PL_OK) {
        pypl_raise(rc, c ? pl_constructor_errmsg(c) : NULL);
        pl_constructor_free(c);
        return NULL;
    }
    PyPlConstructor *o = PyObject_New(PyPlConstructor, &PyPl_ConstructorType);
    if (!o) {
        pl_constructor_free(c);
        return NULL;
    }
    o->c = c;
    o->busy = 0;
    return (PyObject *)o;
}

static void ctor_dealloc(PyPlConstructor *o) {
    pl_constructor_free(o->c);
    PyObject_Free(o);
}

static PyObject *ctor_build(PyPlConstructor *o, PyObject *args) {
    PyObject *plan_obj, *payloads_obj;
    long long rank, mb;
    if (!PyArg_ParseTuple(args, "O!LLO:build", &PyPl_PlanType, &plan_obj, &rank, &mb,
                          &payloads_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(payloads_obj, "build: payloads must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    const int64_t **ptrs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ptrs);
    int64_t *lens = PyMem_Calloc((size_t)(n ? n : 1), sizeof *lens);
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (!views || !ptrs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        Py_buffer *v = &views[got];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), v,
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        if (v->itemsize != 8 || !v->format || !*v->format ||
            !strchr("qlQL", v->format[strlen(v->format) - 1])) {
            PyErr_Format(PyExc_TypeError, "build: payload %zd is not an int64 buffer", got);
            PyBuffer_Release(v);
            goto done;
        }
        ptrs[got] = v->buf;
        lens[got] = (int64_t)(v->len / 8);
    }
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Constructor is in use by another thread");
        goto done;
    }
    o->busy = 1;
    pl_batch *b = NULL;
    int rc;
    const pl_plan *plan = ((PyPlPlan *)plan_obj)->plan;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_constructor_build(o->c, plan, rank, mb, ptrs, lens, (int64_t)n, &b);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    if (rc != PL_OK) pypl_raise(rc, pl_constructor_errmsg(o->c));
    else result = pypl_batch_new(b); /* takes the caller's reference */
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef ctor_methods[] = {
    {"create", (PyCFunction)ctor_create, METH_O | METH_CLASS,
     "Constructor.create(config) -> Constructor\n\nA data constructor for the config's "
     "topology.  Not thread-safe."},
    {"build", (PyCFunction)ctor_build, METH_VARARGS,
     "build(plan, rank, micro_batch, payloads) -> Batch\n\nBuild micro-batch "
     "`micro_batch` of `plan` for global `rank`.  payloads[j] is an\nint64 buffer of "
     "reads[j] tokens, reads = plan.reads(dp_rank of rank, micro_batch)\n(e.g. "
     "Source.read_many).  Bit for bit the Loader's batch.  RangeError, PolyloadError."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PyPl_ConstructorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Constructor",
    .tp_basicsize = sizeof(PyPlConstructor),
    .tp_dealloc = (destructor)ctor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The data constructor alone (pl_constructor): micro-batches from a plan and\n"
              "payloads.  Batches outlive it.",
    .tp_methods = ctor_methods,
};
