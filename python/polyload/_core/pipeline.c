/*
 * pipeline.c -- Pipeline (pl_pipeline) and Work (pl_work, the unit a
 * driver builds), with the package encoder, for the distributed roles of
 * polyload.ray.  A Pipeline's items are packages (PLPK bytes) that it owns
 * in C memory; next() returns a copy as bytes (what a Ray task returns).
 *
 * Every C call runs with the GIL released.  reset() and close() take a
 * write lock; every other call a read lock, so that they run concurrently
 * (the C object is thread-safe) but never against a reset or a free.
 */
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A package held by the pipeline; reference counted, so that next() can copy
 * it after the pipeline's lock is gone (pl_pipeline_options.retain). */
typedef struct {
    atomic_long refs;
    size_t len;
    unsigned char data[];
} pypl_item;

static void item_release(void *item, void *ctx) {
    (void)ctx;
    pypl_item *it = item;
    if (atomic_fetch_sub(&it->refs, 1) == 1) free(it);
}

static void item_retain(void *item, int64_t index, void *ctx) {
    (void)index;
    (void)ctx;
    atomic_fetch_add(&((pypl_item *)item)->refs, 1);
}

/* ================================================================ Work */

typedef struct {
    PyObject_HEAD
    pl_work w;
    PyObject *pipeline; /* keeps the plan alive until complete */
    int done;
} PyPlWork;

extern PyTypeObject PyPl_WorkType;

typedef struct {
    PyObject_HEAD
    pl_pipeline *p;
    pid_t pid;
    pthread_rwlock_t lock;
    int64_t nmb;
} PyPlPipeline;

static int pipe_rd(PyPlPipeline *o) {
    if (o->pid != pypl_getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "Pipeline used in a forked child");
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&o->lock);
    Py_END_ALLOW_THREADS
    if (!o->p) {
        pthread_rwlock_unlock(&o->lock);
        pypl_raise(PL_ECLOSED, "pipeline is closed");
        return -1;
    }
    return 0;
}

static PyObject *work_get(PyPlWork *o, void *c) {
    const char *which = c;
    const pl_work *w = &o->w;
    if (!strcmp(which, "kind")) return PyUnicode_FromString(w->kind == PL_WORK_PLAN ? "plan" : "build");
    long long v = 0;
    if (!strcmp(which, "step")) v = w->step;
    else if (!strcmp(which, "unit")) v = w->unit;
    else if (!strcmp(which, "group")) v = w->group;
    else if (!strcmp(which, "dp_rank")) v = w->dp_rank;
    else if (!strcmp(which, "cp_rank")) v = w->cp_rank;
    else if (!strcmp(which, "micro_batch")) v = w->micro_batch;
    else if (!strcmp(which, "n_micro_batches")) v = w->n_micro_batches;
    return PyLong_FromLongLong(v);
}

/* reads() -> int64 Array [n, 4]: pl_plan_step_reads of the unit's DP rank. */
static int pipe_rd(PyPlPipeline *o);
static int work_current(PyPlPipeline *o, const PyPlWork *w);
static PyObject *work_reads_locked(PyPlWork *o);

static PyObject *work_reads(PyPlWork *o, PyObject *unused) {
    (void)unused;
    if (o->w.kind != PL_WORK_BUILD || o->done || !o->w.plan) {
        PyErr_SetString(PyExc_ValueError, "reads(): not an open build unit");
        return NULL;
    }
    PyPlPipeline *pp = (PyPlPipeline *)o->pipeline;
    if (pipe_rd(pp)) return NULL;
    if (!work_current(pp, o)) { /* reset since: its plan is gone */
        pthread_rwlock_unlock(&pp->lock);
        return pypl_raise(PL_ECLOSED, "reads(): the pipeline was reset since this work");
    }
    PyObject *r = work_reads_locked(o);
    pthread_rwlock_unlock(&pp->lock);
    return r;
}

static PyObject *work_reads_locked(PyPlWork *o) {
    int64_t n = 0;
    int rc = pl_plan_step_reads(o->w.plan, o->w.dp_rank, NULL, 0, &n);
    if (rc != PL_OK && rc != PL_EINVAL) return pypl_raise(rc, "plan: step reads");
    pl_read *r = PyMem_Calloc((size_t)(n ? n : 1), sizeof *r);
    int64_t *out = malloc((size_t)(n ? n : 1) * 4 * sizeof(int64_t));
    if (!r || !out) {
        PyMem_Free(r);
        free(out);
        return PyErr_NoMemory();
    }
    rc = pl_plan_step_reads(o->w.plan, o->w.dp_rank, r, n, &n);
    for (int64_t i = 0; rc == PL_OK && i < n; i++) {
        out[i * 4 + 0] = r[i].source;
        out[i * 4 + 1] = r[i].index;
        out[i * 4 + 2] = r[i].offset;
        out[i * 4 + 3] = r[i].count;
    }
    PyMem_Free(r);
    if (rc != PL_OK) {
        free(out);
        return pypl_raise(rc, "plan: step reads");
    }
    Py_ssize_t shape[2] = {(Py_ssize_t)n, 4};
    return pypl_array_owned(out, "q", 8, 2, shape);
}

static void work_dealloc(PyPlWork *o) {
    Py_XDECREF(o->pipeline);
    PyObject_Free(o);
}

static PyMethodDef work_methods[] = {
    {"reads", (PyCFunction)work_reads, METH_NOARGS,
     "reads() -> Array int64 [n, 4]\n\nThe reads of the unit's DP rank for the whole step "
     "(pl_plan_step_reads):\ncolumns source, index, offset, count."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef work_getset[] = {
    {"kind", (getter)work_get, NULL, "'plan' or 'build'", "kind"},
    {"step", (getter)work_get, NULL, "int", "step"},
    {"unit", (getter)work_get, NULL, "int", "unit"},
    {"group", (getter)work_get, NULL, "int", "group"},
    {"dp_rank", (getter)work_get, NULL, "int", "dp_rank"},
    {"cp_rank", (getter)work_get, NULL, "int", "cp_rank"},
    {"micro_batch", (getter)work_get, NULL, "int: first micro-batch", "micro_batch"},
    {"n_micro_batches", (getter)work_get, NULL, "int", "n_micro_batches"},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyPl_WorkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Work",
    .tp_basicsize = sizeof(PyPlWork),
    .tp_dealloc = (destructor)work_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A unit of work of a Pipeline (pl_work): 'plan' (add step `step`) or 'build'.",
    .tp_methods = work_methods,
    .tp_getset = work_getset,
};

/* ============================================================ Pipeline */

static PyObject *pipe_create(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"config", "ranks", "group_by_cp", "unit", "prefetch",
                             "max_lag_steps", NULL};
    PyObject *cfg_obj, *ranks_obj = Py_None;
    int group_by_cp = 1;
    long long unit = 0, prefetch = 0, lag = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OpLLL:create", kwlist, &PyPl_ConfigType,
                                     &cfg_obj, &ranks_obj, &group_by_cp, &unit, &prefetch,
                                     &lag))
        return NULL;
    int64_t *ranks = NULL;
    Py_ssize_t n = 0;
    if (ranks_obj != Py_None) {
        PyObject *seq = PySequence_Fast(ranks_obj, "ranks must be a sequence of int");
        if (!seq) return NULL;
        n = PySequence_Fast_GET_SIZE(seq);
        ranks = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ranks);
        if (!ranks) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            ranks[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (ranks[i] == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                PyMem_Free(ranks);
                return NULL;
            }
        }
        Py_DECREF(seq);
    }
    pl_pipeline_options po;
    memset(&po, 0, sizeof po);
    po.version = PL_PIPELINE_OPTIONS_VERSION;
    po.ranks = ranks;
    po.n_ranks = (int64_t)n;
    po.group_by_cp = group_by_cp;
    po.unit = unit;
    po.prefetch = prefetch;
    po.max_lag_steps = lag;
    po.release = item_release;
    po.retain = item_retain;
    PyPlConfig *cfg = (PyPlConfig *)cfg_obj;
    pl_pipeline *p = NULL;
    int rc;
    pl_config *shared = pypl_config_shared(cfg);
    cfg->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_pipeline_create(shared, &po, &p);
    Py_END_ALLOW_THREADS
    cfg->busy--;
    PyMem_Free(ranks);
    if (rc != PL_OK) {
        pypl_raise(rc, pl_pipeline_errmsg(p));
        pl_pipeline_free(p);
        return NULL;
    }
    PyPlPipeline *o = PyObject_New(PyPlPipeline, &PyPl_PipelineType);
    if (!o) {
        pl_pipeline_free(p);
        return NULL;
    }
    o->p = p;
    o->pid = pypl_getpid();
    int64_t nmb = 0;
    pl_config_get_int(cfg->cfg, "micro_batches_per_rank", &nmb);
    o->nmb = nmb;
    if (pthread_rwlock_init(&o->lock, NULL) != 0) {
        pl_pipeline_free(o->p);
        o->p = NULL;
        o->pid = -1;
        Py_DECREF(o);
        return PyErr_NoMemory();
    }
    return (PyObject *)o;
}

/* Whether a Work still belongs to the pipeline's generation (its plan and
 * blob are alive).  Read lock held. */
static int work_current(PyPlPipeline *o, const PyPlWork *w) {
    return o->p && w->pipeline == (PyObject *)o && !w->done &&
           w->w.generation == pl_pipeline_generation(o->p);
}

static void pipe_free_c(PyPlPipeline *o) {
    pl_pipeline *p = o->p;
    if (!p) return;
    Py_BEGIN_ALLOW_THREADS
    pl_pipeline_close(p);
    pthread_rwlock_wrlock(&o->lock);
    o->p = NULL;
    pthread_rwlock_unlock(&o->lock);
    pl_pipeline_free(p);
    Py_END_ALLOW_THREADS
}

static void pipe_dealloc(PyPlPipeline *o) {
    if (o->pid == pypl_getpid()) {
        pipe_free_c(o);
        pthread_rwlock_destroy(&o->lock);
    }
    PyObject_Free(o);
}

static PyObject *pipe_close(PyPlPipeline *o, PyObject *unused) {
    (void)unused;
    if (o->pid != pypl_getpid()) {
        o->p = NULL;
        Py_RETURN_NONE;
    }
    pipe_free_c(o);
    Py_RETURN_NONE;
}

static PyObject *pipe_stop(PyPlPipeline *o, PyObject *unused) {
    (void)unused;
    if (pipe_rd(o)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pl_pipeline_close(o->p);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    Py_RETURN_NONE;
}

static PyObject *pipe_reset(PyPlPipeline *o, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    if (o->pid != pypl_getpid() || !o->p) {
        PyBuffer_Release(&v);
        return pypl_raise(PL_ECLOSED, "pipeline is closed");
    }
    char err[PL_ERRMSG_MAX];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pl_pipeline_close(o->p); /* wake waiters so that the write lock comes */
    pthread_rwlock_wrlock(&o->lock);
    rc = pl_pipeline_reset(o->p, v.buf, (size_t)v.len, err, sizeof err);
    pthread_rwlock_unlock(&o->lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (rc != PL_OK) return pypl_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *pipe_get_work(PyPlPipeline *o, PyObject *args) {
    unsigned kinds = PL_WORK_PLAN | PL_WORK_BUILD;
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|IL:get_work", &kinds, &timeout)) return NULL;
    if (pipe_rd(o)) return NULL;
    PyPlWork *w = PyObject_New(PyPlWork, &PyPl_WorkType);
    if (!w) {
        pthread_rwlock_unlock(&o->lock);
        return NULL;
    }
    w->pipeline = Py_NewRef((PyObject *)o);
    w->done = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_pipeline_get_work(o->p, kinds, timeout, &w->w);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (rc == PL_OK) return (PyObject *)w;
    Py_DECREF(w);
    if (rc == PL_DONE) return PyUnicode_FromString("done");
    if (rc == PL_ETIMEDOUT) Py_RETURN_NONE;
    return pypl_raise(rc, "pipeline: closed or failed");
}

static PyObject *pipe_add_step(PyPlPipeline *o, PyObject *args) {
    long long step;
    PyObject *plan_obj, *blob_obj, *work_obj = Py_None;
    if (!PyArg_ParseTuple(args, "LOO|O:add_step", &step, &plan_obj, &blob_obj, &work_obj))
        return NULL;
    if (work_obj != Py_None && !PyObject_TypeCheck(work_obj, &PyPl_WorkType)) {
        PyErr_SetString(PyExc_TypeError, "add_step: work must be the 'plan' Work");
        return NULL;
    }
    Py_buffer pv = {0}, bv = {0};
    int have_plan = plan_obj != Py_None, have_blob = blob_obj != Py_None;
    if (have_plan && PyObject_GetBuffer(plan_obj, &pv, PyBUF_SIMPLE) < 0) return NULL;
    if (have_blob && PyObject_GetBuffer(blob_obj, &bv, PyBUF_SIMPLE) < 0) {
        if (have_plan) PyBuffer_Release(&pv);
        return NULL;
    }
    if (pipe_rd(o)) {
        if (have_plan) PyBuffer_Release(&pv);
        if (have_blob) PyBuffer_Release(&bv);
        return NULL;
    }
    int rc = PL_OK;
    if (work_obj != Py_None &&
        ((PyPlWork *)work_obj)->w.generation != pl_pipeline_generation(o->p))
        rc = PL_ECLOSED; /* asked before a reset: dropped */
    Py_BEGIN_ALLOW_THREADS
    pl_plan *plan = NULL;
    if (rc == PL_OK && have_plan) rc = pl_plan_decode(pv.buf, (size_t)pv.len, &plan);
    if (rc == PL_OK)
        rc = pl_pipeline_add_step(o->p, step, plan, have_blob ? bv.buf : NULL,
                                  have_blob ? (size_t)bv.len : 0, NULL, NULL);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (have_plan) PyBuffer_Release(&pv);
    if (have_blob) PyBuffer_Release(&bv);
    if (rc == PL_ECLOSED) Py_RETURN_NONE;
    if (rc != PL_OK) return pypl_raise(rc, "pipeline: add_step: corrupt plan or a step not asked for");
    Py_RETURN_NONE;
}

static PyObject *pipe_fail_step(PyPlPipeline *o, PyObject *args) {
    long long step;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "Lis:fail_step", &step, &code, &msg)) return NULL;
    if (pipe_rd(o)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_pipeline_fail_step(o->p, step, code, msg);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (rc != PL_OK) return pypl_raise(rc, "pipeline: fail_step: a step not asked for");
    Py_RETURN_NONE;
}

/* Encode the unit's package from its payloads (and images) and hand it over;
 * None, or NULL with an exception. */
static PyObject *pipe_finish(PyPlPipeline *o, PyPlWork *w, const pl_payload *pay, int64_t n,
                             const pl_payload_image *img, int64_t ni) {
    if (pipe_rd(o)) return NULL;
    if (!work_current(o, w)) { /* reset since: its plan is gone, drop the unit */
        pthread_rwlock_unlock(&o->lock);
        w->done = 1;
        return Py_NewRef(Py_None);
    }
    int rc;
    size_t len = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_package_encode_v2(w->w.plan, w->w.dp_rank, w->w.blob, w->w.blob_len, pay, n, img,
                              ni, NULL, 0, &len);
    pypl_item *item = NULL;
    if (rc == PL_OK) {
        item = malloc(sizeof *item + len);
        rc = item ? PL_OK : PL_ENOMEM;
    }
    if (rc == PL_OK) {
        atomic_init(&item->refs, 1);
        item->len = len;
        rc = pl_package_encode_v2(w->w.plan, w->w.dp_rank, w->w.blob, w->w.blob_len, pay, n,
                                  img, ni, item->data, len, &len);
    }
    if (rc == PL_OK) {
        pl_pipeline_complete(o->p, &w->w, PL_OK, NULL, item, NULL, NULL);
    } else {
        free(item);
        pl_pipeline_complete(o->p, &w->w, rc, "constructor: payloads do not match the plan",
                             NULL, NULL, NULL);
    }
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    w->done = 1;
    if (rc != PL_OK) return pypl_raise(rc, "constructor: payloads do not match the plan's reads");
    return Py_NewRef(Py_None);
}

/* complete(work, buffers, dtypes, read_buf, read_off): encode the unit's
 * package from payload buffers (read j is at byte read_off[j] of
 * buffers[read_buf[j]], at dtype dtypes[j]) and hand it over. */
static PyObject *pipe_complete(PyPlPipeline *o, PyObject *args) {
    PyObject *wo, *bufs;
    Py_buffer dt, rb, ro;
    if (!PyArg_ParseTuple(args, "O!Oy*y*y*:complete", &PyPl_WorkType, &wo, &bufs, &dt, &rb,
                          &ro))
        return NULL;
    PyPlWork *w = (PyPlWork *)wo;
    PyObject *seq = NULL;
    Py_buffer *views = NULL;
    pl_payload *pay = NULL;
    Py_ssize_t nb = 0, got = 0;
    PyObject *ret = NULL;
    int64_t n = (int64_t)(rb.len / 8);
    if (w->done || w->w.kind != PL_WORK_BUILD || w->pipeline != (PyObject *)o ||
        ro.len != rb.len || rb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "complete: not an open build unit of this pipeline, "
                                          "or read_buf/read_off lengths differ");
        goto out;
    }
    seq = PySequence_Fast(bufs, "buffers must be a sequence");
    if (!seq) goto out;
    nb = PySequence_Fast_GET_SIZE(seq);
    if (dt.len != rb.len) {
        PyErr_SetString(PyExc_ValueError, "complete: one int64 dtype per read");
        goto out;
    }
    views = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *views);
    pay = PyMem_Calloc((size_t)(n ? n : 1), sizeof *pay);
    if (!views || !pay) {
        PyErr_NoMemory();
        goto out;
    }
    for (; got < nb; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto out;
    const int64_t *dts = dt.buf, *rbv = rb.buf, *rov = ro.buf;
    for (int64_t j = 0; j < n; j++) {
        if (rbv[j] < 0 || rbv[j] >= nb || rov[j] < 0 || rov[j] > views[rbv[j]].len) {
            PyErr_Format(PyExc_ValueError, "complete: read %lld points outside its buffer",
                         (long long)j);
            goto out;
        }
        int64_t d = dts[j];
        size_t es = d >= PL_DTYPE_UINT8 && d <= PL_DTYPE_UINT32 ? pl_dtype_size((int)d) : 0;
        if (!es) {
            PyErr_Format(PyExc_ValueError, "complete: bad dtype %lld", (long long)d);
            goto out;
        }
        pay[j].data = (const unsigned char *)views[rbv[j]].buf + rov[j];
        pay[j].dtype = (int32_t)d;
        pay[j].count = (int64_t)((size_t)(views[rbv[j]].len - rov[j]) / es);
    }
    ret = pipe_finish(o, w, pay, n, NULL, 0);
out:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(pay);
    Py_XDECREF(seq);
    PyBuffer_Release(&dt);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ro);
    return ret;
}

/* complete_replies(work, replies, read_buf, read_row): encode the unit's
 * package from source-loader replies (pl_reply_encode's PLRR bytes): read j
 * is row read_row[j] of replies[read_buf[j]], its image (if any) that row's.
 * Each reply is checked (pl_reply_decode) before use. */
static PyObject *pipe_complete_replies(PyPlPipeline *o, PyObject *args) {
    PyObject *wo, *bufs;
    Py_buffer rb, rr;
    if (!PyArg_ParseTuple(args, "O!Oy*y*:complete_replies", &PyPl_WorkType, &wo, &bufs, &rb,
                          &rr))
        return NULL;
    PyPlWork *w = (PyPlWork *)wo;
    PyObject *seq = NULL, *ret = NULL;
    Py_buffer *views = NULL;
    pl_payload *pay = NULL, **rows = NULL;
    pl_payload_image *img = NULL, **imgs = NULL;
    int64_t **img_of = NULL, *nrows = NULL, ni = 0;
    Py_ssize_t nb = 0, got = 0;
    const int64_t n = (int64_t)(rb.len / 8);
    if (w->done || w->w.kind != PL_WORK_BUILD || w->pipeline != (PyObject *)o ||
        rr.len != rb.len || rb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "complete_replies: not an open build unit of this "
                                          "pipeline, or read_buf/read_row lengths differ");
        goto out;
    }
    seq = PySequence_Fast(bufs, "replies must be a sequence");
    if (!seq) goto out;
    nb = PySequence_Fast_GET_SIZE(seq);
    views = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *views);
    rows = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *rows);
    imgs = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *imgs);
    img_of = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *img_of);
    nrows = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof *nrows);
    pay = PyMem_Calloc((size_t)(n ? n : 1), sizeof *pay);
    img = PyMem_Calloc((size_t)(n ? n : 1), sizeof *img);
    if (!views || !rows || !imgs || !img_of || !nrows || !pay || !img) {
        PyErr_NoMemory();
        goto out;
    }
    for (; got < nb; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto out;
    for (Py_ssize_t i = 0; i < nb; i++) {
        int64_t nr = 0, nim = 0;
        int rc = pl_reply_decode(views[i].buf, (size_t)views[i].len, NULL, 0, NULL, 0, &nr, &nim);
        if (rc == PL_OK) {
            rows[i] = PyMem_Calloc((size_t)(nr ? nr : 1), sizeof **rows);
            imgs[i] = PyMem_Calloc((size_t)(nim ? nim : 1), sizeof **imgs);
            img_of[i] = PyMem_Malloc((size_t)(nr ? nr : 1) * sizeof **img_of);
            if (!rows[i] || !imgs[i] || !img_of[i]) {
                PyErr_NoMemory();
                goto out;
            }
            rc = pl_reply_decode(views[i].buf, (size_t)views[i].len, rows[i], nr, imgs[i], nim,
                                 &nr, &nim);
        }
        if (rc != PL_OK) {
            pypl_raise(PL_EINVAL, "constructor: a source loader's reply is corrupt");
            goto out;
        }
        nrows[i] = nr;
        for (int64_t r = 0; r < nr; r++) img_of[i][r] = -1;
        for (int64_t k = 0; k < nim; k++) img_of[i][imgs[i][k].read] = k;
    }
    const int64_t *rbv = rb.buf, *rrv = rr.buf;
    for (int64_t j = 0; j < n; j++) {
        if (rbv[j] < 0 || rbv[j] >= nb || rrv[j] < 0 || rrv[j] >= nrows[rbv[j]]) {
            PyErr_Format(PyExc_ValueError, "complete_replies: read %lld names no reply row",
                         (long long)j);
            goto out;
        }
        pay[j] = rows[rbv[j]][rrv[j]];
        int64_t k = img_of[rbv[j]][rrv[j]];
        if (k >= 0) {
            img[ni] = imgs[rbv[j]][k];
            img[ni++].read = j;
        }
    }
    ret = pipe_finish(o, w, pay, n, img, ni);
out:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    for (Py_ssize_t i = 0; i < nb && rows; i++) {
        PyMem_Free(rows[i]);
        PyMem_Free(imgs[i]);
        PyMem_Free(img_of[i]);
    }
    PyMem_Free(views);
    PyMem_Free(rows);
    PyMem_Free(imgs);
    PyMem_Free(img_of);
    PyMem_Free(nrows);
    PyMem_Free(pay);
    PyMem_Free(img);
    Py_XDECREF(seq);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&rr);
    return ret;
}

static PyObject *pipe_fail(PyPlPipeline *o, PyObject *args) {
    PyObject *wo;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "O!is:fail", &PyPl_WorkType, &wo, &code, &msg)) return NULL;
    PyPlWork *w = (PyPlWork *)wo;
    if (w->done || w->pipeline != (PyObject *)o) Py_RETURN_NONE;
    if (pipe_rd(o)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pl_pipeline_complete(o->p, &w->w, code ? code : PL_EIO, msg, NULL, NULL, NULL);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    w->done = 1;
    Py_RETURN_NONE;
}

/* next(rank, max_count=1, timeout_ms=-1) -> (bytes, step, micro_batch, count),
 * None after train_steps; PolyloadTimeoutError, LagError, ... */
static PyObject *pipe_next(PyPlPipeline *o, PyObject *args) {
    long long rank, max_count = 1, timeout = -1;
    if (!PyArg_ParseTuple(args, "L|LL:next", &rank, &max_count, &timeout)) return NULL;
    if (pipe_rd(o)) return NULL;
    pl_pipeline_item it;
    char err[PL_ERRMSG_MAX];
    err[0] = '\0';
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_pipeline_next(o->p, rank, max_count, timeout, &it, err, sizeof err);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rc == PL_OK) {
        /* The item stays pinned until this rank's next call: copy it now. */
        pypl_item *item = it.item; /* retained for us by the pipeline */
        PyObject *b = PyBytes_FromStringAndSize((const char *)item->data, (Py_ssize_t)item->len);
        item_release(item, NULL);
        if (b) ret = Py_BuildValue("(NLLL)", b, (long long)it.step, (long long)it.micro_batch,
                                   (long long)it.count);
    }
    pthread_rwlock_unlock(&o->lock);
    if (rc == PL_DONE) Py_RETURN_NONE;
    if (rc != PL_OK) return pypl_raise(rc, err);
    return ret;
}

typedef struct {
    pl_pipeline *p;
    int64_t timeout;
    char err[PL_ERRMSG_MAX];
} pipe_state_ctx;

static int pipe_state_fn(void *ctx, void *buf, size_t cap, size_t *len) {
    pipe_state_ctx *c = ctx;
    return pl_pipeline_get_state(c->p, c->timeout, buf, cap, len, c->err, sizeof c->err);
}

static PyObject *pipe_get_state(PyPlPipeline *o, PyObject *args) {
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|L:get_state", &timeout)) return NULL;
    if (pipe_rd(o)) return NULL;
    pipe_state_ctx c = {o->p, timeout, ""};
    int rc;
    PyObject *b = pypl_sized_bytes(pipe_state_fn, &c, &rc);
    pthread_rwlock_unlock(&o->lock);
    if (!b && rc != PL_OK) return pypl_raise(rc, c.err);
    return b;
}

static PyObject *pipe_position(PyPlPipeline *o, PyObject *unused) {
    (void)unused;
    if (pipe_rd(o)) return NULL;
    int64_t step = 0, mb = 0;
    int have = 0;
    pl_pipeline_position(o->p, &step, &mb, &have);
    pthread_rwlock_unlock(&o->lock);
    return Py_BuildValue("LLO", (long long)step, (long long)mb, have ? Py_True : Py_False);
}

static PyObject *pipe_attach_state(PyPlPipeline *o, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    if (pipe_rd(o)) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char err[PL_ERRMSG_MAX] = "";
    int rc = pl_pipeline_attach_state(o->p, v.buf, (size_t)v.len, err, sizeof err);
    pthread_rwlock_unlock(&o->lock);
    PyBuffer_Release(&v);
    if (rc != PL_OK) return pypl_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *pipe_sizeof(PyPlPipeline *o, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(o->p ? pl_pipeline_sizeof(o->p) : 0);
}

static PyMethodDef pipe_methods[] = {
    {"create", (PyCFunction)(void (*)(void))pipe_create,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Pipeline.create(config, ranks=None, group_by_cp=True, unit=0, prefetch=0,\n"
     "max_lag_steps=0) -> Pipeline\n\nThe step ledger (pl_pipeline) for `ranks`; items are "
     "packages.  Touches no file."},
    {"position", (PyCFunction)pipe_position, METH_NOARGS,
     "position() -> (step, micro_batch, have_blob)\n\nThe consumed position and whether "
     "the state blob of its step's start is held\n(pl_pipeline_position)."},
    {"attach_state", (PyCFunction)pipe_attach_state, METH_O,
     "attach_state(blob)\n\nThe state blob of a step's start, for a step added without "
     "it\n(pl_pipeline_attach_state).  StateError for a corrupt blob or one not at a "
     "step's start."},
    {"reset", (PyCFunction)pipe_reset, METH_O,
     "reset(blob)\n\nStand at a state blob's position; drops everything.  StateError."},
    {"get_work", (PyCFunction)pipe_get_work, METH_VARARGS,
     "get_work(kinds=3, timeout_ms=-1) -> Work, None (timeout) or 'done'\n\n"
     "kinds: 1 plan, 2 build, 3 both.  Raises PolyloadError ECLOSED when closed/failed."},
    {"add_step", (PyCFunction)pipe_add_step, METH_VARARGS,
     "add_step(step, plan_bytes or None, state_blob or None)\n\nSupply the step a 'plan' Work "
     "asked for (PLPN bytes; None for step train_steps)."},
    {"fail_step", (PyCFunction)pipe_fail_step, METH_VARARGS,
     "fail_step(step, code, message)\n\nThe step failed (the ranks reaching it get the error)."},
    {"complete", (PyCFunction)pipe_complete, METH_VARARGS,
     "complete(work, buffers, dtypes, read_buf, read_off)\n\nEncode the unit's package "
     "(pl_package_encode) from payload buffers at stored width:\nread j lies at byte "
     "read_off[j] of buffers[read_buf[j]], at dtype dtypes[j] (int64\narrays).  The reads "
     "are work.reads() in order."},
    {"complete_replies", (PyCFunction)pipe_complete_replies, METH_VARARGS,
     "complete_replies(work, replies, read_buf, read_row)\n\nEncode the unit's package "
     "(pl_package_encode_v2) from source-loader replies\n(read_rows_reply's PLRR bytes, "
     "checked by pl_reply_decode): read j is row\nread_row[j] of replies[read_buf[j]] "
     "(int64 arrays), with that row's image.  The\nreads are work.reads() in order."},
    {"fail", (PyCFunction)pipe_fail, METH_VARARGS,
     "fail(work, code, message)\n\nThe unit failed; the rank that reaches it gets the error."},
    {"next", (PyCFunction)pipe_next, METH_VARARGS,
     "next(rank, max_count=1, timeout_ms=-1) -> (package bytes, step, micro_batch, count)\n"
     "or None after train_steps.  PolyloadTimeoutError, LagError, RangeError, or the "
     "error of\nthe unit or step."},
    {"get_state", (PyCFunction)pipe_get_state, METH_VARARGS,
     "get_state(timeout_ms=-1) -> bytes\n\nThe state blob of the consumed position."},
    {"stop", (PyCFunction)pipe_stop, METH_NOARGS,
     "stop()\n\nWake every waiting call with ECLOSED until reset()."},
    {"close", (PyCFunction)pipe_close, METH_NOARGS, "close()\n\nFree the pipeline; idempotent."},
    {"sizeof", (PyCFunction)pipe_sizeof, METH_NOARGS,
     "sizeof() -> int\n\nBytes held by the ledger (pl_pipeline_sizeof), items excluded."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PyPl_PipelineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Pipeline",
    .tp_basicsize = sizeof(PyPlPipeline),
    .tp_dealloc = (destructor)pipe_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The step ledger both deployments drive (pl_pipeline), holding packages.\n"
              "Thread-safe: calls may come from several threads.",
    .tp_methods = pipe_methods,
};
