/*
 * planner.c -- Planner (pl_planner): plans from metadata, its state blob.
 * Sources are borrowed by the C planner: the Planner keeps them alive.
 */
#include "core.h"

#include <string.h>

/* ============================================================ Planner */

typedef struct {
    PyObject_HEAD
    pl_planner *p;
    PyObject *config;  /* the Config (kept for the sources' config) */
    PyObject *sources; /* tuple of Source: borrowed by the planner */
    pl_source **arr;   /* their handles: the planner borrows the array too */
    int busy;
} PyPlPlanner;

static PyObject *planner_create(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"config", "sources", NULL};
    PyObject *cfg_obj, *src_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|O:create", kwlist, &PyPl_ConfigType,
                                     &cfg_obj, &src_obj))
        return NULL;
    PyPlConfig *cfg = (PyPlConfig *)cfg_obj;
    int64_t n = pl_config_num_sources(cfg->cfg);
    PyObject *sources;
    if (src_obj == Py_None) {
        sources = PyTuple_New((Py_ssize_t)n);
        if (!sources) return NULL;
        for (int64_t i = 0; i < n; i++) {
            PyObject *idx = PyLong_FromLongLong((long long)i);
            PyObject *s = idx ? PyObject_CallMethod(cfg_obj, "open_source", "O", idx) : NULL;
            Py_XDECREF(idx);
            if (!s) {
                Py_DECREF(sources);
                return NULL;
            }
            PyTuple_SET_ITEM(sources, (Py_ssize_t)i, s);
        }
    } else {
        sources = PySequence_Tuple(src_obj);
        if (!sources) return NULL;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sources); i++) {
            if (!PyObject_TypeCheck(PyTuple_GET_ITEM(sources, i), &PyPl_SourceType)) {
                Py_DECREF(sources);
                PyErr_SetString(PyExc_TypeError, "Planner.create: sources must be Source objects");
                return NULL;
            }
        }
    }
    Py_ssize_t ns = PyTuple_GET_SIZE(sources);
    pl_source **arr = PyMem_Calloc(ns ? (size_t)ns : 1, sizeof *arr);
    if (!arr) {
        Py_DECREF(sources);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < ns; i++)
        arr[i] = ((PyPlSource *)PyTuple_GET_ITEM(sources, i))->src;
    pl_planner *p = NULL;
    int rc;
    pl_config *shared = pypl_config_shared(cfg);
    cfg->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_planner_create(shared, arr, (int64_t)ns, &p);
    Py_END_ALLOW_THREADS
    cfg->busy--;
    if (rc != PL_OK) {
        pypl_raise(rc, p ? pl_planner_errmsg(p) : NULL);
        pl_planner_free(p);
        PyMem_Free(arr);
        Py_DECREF(sources);
        return NULL;
    }
    PyPlPlanner *o = PyObject_New(PyPlPlanner, &PyPl_PlannerType);
    if (!o) {
        pl_planner_free(p);
        PyMem_Free(arr);
        Py_DECREF(sources);
        return NULL;
    }
    o->p = p;
    o->arr = arr;
    o->config = Py_NewRef(cfg_obj);
    o->sources = sources;
    o->busy = 0;
    return (PyObject *)o;
}

static void planner_dealloc(PyPlPlanner *o) {
    pl_planner_free(o->p); /* before the sources it borrows */
    PyMem_Free(o->arr);
    Py_XDECREF(o->sources);
    Py_XDECREF(o->config);
    PyObject_Free(o);
}

static int planner_enter(PyPlPlanner *o) {
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Planner is in use by another thread (it is not thread-safe)");
        return -1;
    }
    o->busy = 1;
    return 0;
}


/* The next plan (the planner never ends: it returns no PL_DONE), or NULL
 * with an exception set. */
static pl_plan *planner_next_raw(PyPlPlanner *o) {
    if (planner_enter(o)) return NULL;
    pl_plan *pl = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_planner_next(o->p, &pl);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    if (rc != PL_OK) {
        pypl_raise(rc, pl_planner_errmsg(o->p));
        return NULL;
    }
    return pl;
}

static PyObject *planner_next(PyPlPlanner *o, PyObject *unused) {
    (void)unused;
    pl_plan *pl = planner_next_raw(o);
    if (!pl) return NULL;
    PyObject *d = pypl_plan_to_dict(pl);
    pl_plan_free(pl);
    return d;
}

static PyObject *planner_next_plan(PyPlPlanner *o, PyObject *unused) {
    (void)unused;
    pl_plan *pl = planner_next_raw(o);
    return pl ? pypl_plan_wrap(pl) : NULL;
}

static PyObject *planner_get_state(PyPlPlanner *o, PyObject *unused) {
    (void)unused;
    if (planner_enter(o)) return NULL;
    size_t n = 0;
    int rc = pl_planner_get_state(o->p, NULL, 0, &n);
    PyObject *b = NULL;
    if (rc == PL_OK) {
        b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
        if (b) rc = pl_planner_get_state(o->p, PyBytes_AS_STRING(b), n, &n);
    }
    o->busy = 0;
    if (rc != PL_OK) {
        Py_XDECREF(b);
        return pypl_raise(rc, pl_planner_errmsg(o->p));
    }
    return b;
}

static PyObject *planner_set_state(PyPlPlanner *o, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (planner_enter(o)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_planner_set_state(o->p, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    PyBuffer_Release(&view);
    if (rc != PL_OK) return pypl_raise(rc, pl_planner_errmsg(o->p));
    Py_RETURN_NONE;
}

static PyObject *planner_get_sources(PyPlPlanner *o, void *c) {
    (void)c;
    return Py_NewRef(o->sources);
}

static PyObject *planner_get_errmsg(PyPlPlanner *o, void *c) {
    (void)c;
    return PyUnicode_FromString(pl_planner_errmsg(o->p));
}

static PyMethodDef planner_methods[] = {
    {"create", (PyCFunction)(void (*)(void))planner_create,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Planner.create(config, sources=None) -> Planner\n\n"
     "A planner over `sources` (Source objects in config order; None opens them from\n"
     "the config).  The planner keeps the sources alive.  Raises ConfigError."},
    {"next", (PyCFunction)planner_next, METH_NOARGS,
     "next() -> dict\n\nPlan the next step: {'step', 'dp', 'global_batch_size',\n"
     "'micro_batch_size', 'micro_batches_per_rank', 'seq_length', 'n_sequences',\n"
     "'n_chunks', 'tokens', 'lower_bound',\n"
     " 'chunks': Array [n_chunks, 5] int64 (source, index, offset, length, flags),\n"
     " 'seq_offsets': Array [n_sequences+1] int64, 'seq_tokens': [n_sequences] int64,\n"
     " 'seq_cost': [n_sequences] float64, 'rank_sequences': [n_sequences] int64,\n"
     " 'rank_cost': [dp] float64}.  Sequence q holds chunks[seq_offsets[q]:"
     "seq_offsets[q+1]];\nrow `row` of micro-batch `mb` of DP rank r is sequence\n"
     "rank_sequences[(r * micro_batches_per_rank + mb) * micro_batch_size + row]."},
    {"next_plan", (PyCFunction)planner_next_plan, METH_NOARGS,
     "next_plan() -> Plan\n\nPlan the next step as a Plan handle (encode() to send it to\n"
     "another process; reads() for a constructor; to_dict() as next() returns)."},
    {"get_state", (PyCFunction)planner_get_state, METH_NOARGS,
     "get_state() -> bytes\n\nThe state blob (SPEC section 4) at the current step."},
    {"set_state", (PyCFunction)planner_set_state, METH_O,
     "set_state(blob)\n\nContinue from a state blob.  Raises StateError."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef planner_getset[] = {
    {"sources", (getter)planner_get_sources, NULL, "tuple of Source", NULL},
    {"errmsg", (getter)planner_get_errmsg, NULL, "str: the last error message", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyPl_PlannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Planner",
    .tp_basicsize = sizeof(PyPlPlanner),
    .tp_dealloc = (destructor)planner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The planner alone (pl_planner): plans from metadata, never reading payloads.\n"
              "Not thread-safe: concurrent calls raise RuntimeError.",
    .tp_methods = planner_methods,
    .tp_getset = planner_getset,
};
