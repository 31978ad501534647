/*
 * constructor.c -- Constructor (pl_constructor): micro-batches from a plan
 * and the payloads of its reads.
 */
#include "core.h"

#include <string.h>

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
