/*
 * loader.c -- Loader (pl_loader).
 *
 * The C loader allows concurrent pl_loader_next calls for different ranks and
 * nothing else at the same time.  Loader enforces that with a read-write lock
 * taken with the GIL released (next takes it shared, every other call
 * exclusive) and a per-rank busy flag checked under the GIL: a second
 * concurrent next() for the same rank raises RuntimeError instead of racing.
 *
 * Fork safety: a Loader remembers the pid that created it.  In a forked child
 * its worker threads do not exist and its locks may be held by them, so the
 * child neither uses nor frees it: methods raise, and dealloc/close leak the
 * C state on purpose (the child's memory is a copy; the parent is untouched).
 */
#include "core.h"

#include <pthread.h>
#include <string.h>

/* ============================================================= Loader */

typedef struct {
    PyObject_HEAD
    pl_loader *l;            /* NULL after close() */
    pid_t pid;               /* the process that created it */
    pthread_rwlock_t lock;   /* next: shared; everything else: exclusive */
    int64_t *ranks;          /* served global ranks */
    char *busy;              /* per served rank: a next() is in flight */
    Py_ssize_t n_ranks;
} PyPlLoader;

static int loader_check(PyPlLoader *o) {
    if (o->pid != pypl_getpid()) {
        PyErr_Format(PyExc_RuntimeError,
                     "this Loader was created in process %ld and cannot be used in a "
                     "forked child (%ld); create a new one in the child",
                     (long)o->pid, (long)pypl_getpid());
        return -1;
    }
    if (!o->l) {
        pypl_raise(PL_ECLOSED, "loader is closed");
        return -1;
    }
    return 0;
}

static PyObject *loader_create(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"config", "ranks", "threads", "prefetch", "external", "unit",
                             "max_lag_steps", NULL};
    PyObject *cfg_obj, *ranks_obj = Py_None;
    int threads = 0, prefetch = 0, external = 0;
    long long unit = 0, max_lag = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OiipLL:create", kwlist, &PyPl_ConfigType,
                                     &cfg_obj, &ranks_obj, &threads, &prefetch, &external,
                                     &unit, &max_lag))
        return NULL;
    PyPlConfig *cfg = (PyPlConfig *)cfg_obj;
    if (threads < 0 || prefetch < 0) {
        PyErr_SetString(PyExc_ValueError, "threads and prefetch must be >= 0");
        return NULL;
    }
    PyPlLoader *o = PyObject_New(PyPlLoader, &PyPl_LoaderType);
    if (!o) return NULL;
    o->l = NULL;
    o->pid = pypl_getpid();
    o->ranks = NULL;
    o->busy = NULL;
    o->n_ranks = 0;
    if (pthread_rwlock_init(&o->lock, NULL) != 0) {
        o->pid = -1; /* nothing to destroy */
        Py_DECREF(o);
        return PyErr_NoMemory();
    }
    int all = ranks_obj == Py_None;
    if (all) {
        o->n_ranks = (Py_ssize_t)pl_config_world_size(cfg->cfg);
    } else {
        PyObject *seq = PySequence_Fast(ranks_obj, "ranks must be a sequence of int");
        if (!seq) goto fail;
        o->n_ranks = PySequence_Fast_GET_SIZE(seq);
        o->ranks = PyMem_Calloc((size_t)(o->n_ranks ? o->n_ranks : 1), sizeof(int64_t));
        if (!o->ranks) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < o->n_ranks; i++) {
            long long r = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (r == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                goto fail;
            }
            o->ranks[i] = r;
        }
        Py_DECREF(seq);
    }
    if (all) {
        o->ranks = PyMem_Calloc((size_t)(o->n_ranks ? o->n_ranks : 1), sizeof(int64_t));
        if (!o->ranks) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < o->n_ranks; i++) o->ranks[i] = i;
    }
    o->busy = PyMem_Calloc((size_t)(o->n_ranks ? o->n_ranks : 1), 1);
    if (!o->busy) {
        PyErr_NoMemory();
        goto fail;
    }
    pl_loader_options opts;
    memset(&opts, 0, sizeof opts);
    opts.version = PL_LOADER_OPTIONS_VERSION;
    opts.ranks = all ? NULL : o->ranks;
    opts.n_ranks = all ? 0 : (int64_t)o->n_ranks;
    opts.threads = threads;
    opts.prefetch = prefetch;
    opts.external = external;
    opts.unit = unit;
    opts.max_lag_steps = max_lag;
    pl_loader *l = NULL;
    int rc;
    pl_config *shared = pypl_config_shared(cfg);
    cfg->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_create(shared, &opts, &l);
    Py_END_ALLOW_THREADS
    cfg->busy--;
    if (rc != PL_OK) {
        pypl_raise(rc, l ? pl_loader_errmsg(l) : NULL);
        Py_BEGIN_ALLOW_THREADS
        pl_loader_free(l);
        Py_END_ALLOW_THREADS
        goto fail;
    }
    o->l = l;
    return (PyObject *)o;
fail:
    Py_DECREF(o);
    return NULL;
}

static void loader_free_c(PyPlLoader *o) {
    pl_loader *l = o->l;
    o->l = NULL;
    if (!l) return;
    Py_BEGIN_ALLOW_THREADS
    pl_loader_free(l); /* joins the worker threads, which never take the GIL */
    Py_END_ALLOW_THREADS
}

static void loader_dealloc(PyPlLoader *o) {
    if (o->pid == pypl_getpid()) {
        loader_free_c(o);
        pthread_rwlock_destroy(&o->lock);
    }
    /* else: a forked child leaks the parent's C state on purpose */
    PyMem_Free(o->ranks);
    PyMem_Free(o->busy);
    PyObject_Free(o);
}

static PyObject *loader_close(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    if (o->pid != pypl_getpid()) { /* forked child: forget it without freeing */
        o->l = NULL;
        Py_RETURN_NONE;
    }
    if (!o->l) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&o->lock);
    Py_END_ALLOW_THREADS
    loader_free_c(o);
    pthread_rwlock_unlock(&o->lock);
    Py_RETURN_NONE;
}

/* The next batch of `rank`, retained for the caller, in *out (NULL at the
 * end); 0, or -1 with an exception. */
static int loader_next_owned(PyPlLoader *o, PyObject *arg, pl_batch **out) {
    *out = NULL;
    long long rank = PyLong_AsLongLong(arg);
    if (rank == -1 && PyErr_Occurred()) return -1;
    if (loader_check(o)) return -1;
    Py_ssize_t k = -1;
    for (Py_ssize_t i = 0; i < o->n_ranks; i++)
        if (o->ranks[i] == rank) {
            k = i;
            break;
        }
    if (k < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "loader: rank %lld is not served by this loader", rank);
        pypl_raise(PL_ERANGE, msg);
        return -1;
    }
    if (o->busy[k]) {
        PyErr_Format(PyExc_RuntimeError,
                     "Loader.next(%lld) is already running in another thread", rank);
        return -1;
    }
    o->busy[k] = 1;
    const pl_batch *b = NULL;
    pl_batch *owned = NULL;
    char err[PL_ERRMSG_MAX];
    err[0] = '\0';
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&o->lock);
    if (!o->l) {
        rc = PL_ECLOSED;
        snprintf(err, sizeof err, "loader is closed");
    } else {
        rc = pl_loader_next(o->l, rank, &b);
        if (rc == PL_OK) owned = pl_batch_retain(b); /* b: borrowed until next(rank) */
        else if (rc < 0) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    }
    pthread_rwlock_unlock(&o->lock);
    Py_END_ALLOW_THREADS
    o->busy[k] = 0;
    if (rc == PL_DONE) return 0;
    if (rc != PL_OK) {
        pypl_raise(rc, err);
        return -1;
    }
    *out = owned;
    return 0;
}

static PyObject *loader_next(PyPlLoader *o, PyObject *arg) {
    pl_batch *b = NULL;
    if (loader_next_owned(o, arg, &b)) return NULL;
    if (!b) Py_RETURN_NONE;
    return pypl_batch_new(b);
}

/* next_dict(rank, export): next() and Batch.to_dict(*export) in one call, with
 * no Batch object (the hot path of polyload.Loader.next_batch). */
static PyObject *loader_next_dict(PyPlLoader *o, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *exp = nargs == 2 ? args[1] : NULL;
    if (!exp || !PyTuple_Check(exp) || PyTuple_GET_SIZE(exp) != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "next_dict(rank, (convert, writable, dlpack)) takes a rank and a "
                        "3-tuple of Batch.to_dict's arguments");
        return NULL;
    }
    PyObject *convert = PyTuple_GET_ITEM(exp, 0), *dlpack = PyTuple_GET_ITEM(exp, 2);
    int writable = PyObject_IsTrue(PyTuple_GET_ITEM(exp, 1));
    if (writable < 0) return NULL;
    if (dlpack == Py_None) dlpack = NULL;
    if (pypl_batch_dict_check(convert, writable, dlpack)) return NULL; /* before taking one */
    pl_batch *b = NULL;
    if (loader_next_owned(o, args[0], &b)) return NULL;
    if (!b) Py_RETURN_NONE;
    PyObject *d = pypl_batch_dict(b, convert, writable, dlpack);
    pl_batch_release(b); /* the exported fields hold their own references */
    return d;
}

/* Take the exclusive lock with the GIL released; 0 on success. */
static int loader_lock(PyPlLoader *o) {
    if (loader_check(o)) return -1;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&o->lock);
    Py_END_ALLOW_THREADS
    if (!o->l) { /* closed while we waited */
        pthread_rwlock_unlock(&o->lock);
        pypl_raise(PL_ECLOSED, "loader is closed");
        return -1;
    }
    return 0;
}

/* Take the shared lock with the GIL released; 0 on success. */
static int loader_rdlock(PyPlLoader *o) {
    if (loader_check(o)) return -1;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&o->lock);
    Py_END_ALLOW_THREADS
    if (!o->l) {
        pthread_rwlock_unlock(&o->lock);
        pypl_raise(PL_ECLOSED, "loader is closed");
        return -1;
    }
    return 0;
}

static int loader_state_fn(void *l, void *buf, size_t cap, size_t *len) {
    return pl_loader_get_state(l, buf, cap, len);
}

static PyObject *loader_get_state(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    if (loader_rdlock(o)) return NULL;
    int rc;
    PyObject *b = pypl_sized_bytes(loader_state_fn, o->l, &rc);
    if (!b && rc != PL_OK) pypl_raise(rc, pl_last_errmsg());
    pthread_rwlock_unlock(&o->lock);
    return b;
}

static PyObject *loader_set_state(PyPlLoader *o, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (loader_lock(o)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_set_state(o->l, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyObject *r = rc == PL_OK ? Py_NewRef(Py_None) : pypl_raise(rc, pl_last_errmsg());
    pthread_rwlock_unlock(&o->lock);
    PyBuffer_Release(&view);
    return r;
}

static PyObject *loader_stats(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    if (loader_rdlock(o)) return NULL;
    pl_loader_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    int64_t ns = pl_config_num_sources(pl_loader_config(o->l));
    pl_source_summary *sums = PyMem_Calloc(ns > 0 ? (size_t)ns : 1, sizeof *sums);
    PyObject *d = NULL, *srcs = NULL;
    if (!sums) {
        PyErr_NoMemory();
        goto done;
    }
    int rc;
    char err[PL_ERRMSG_MAX];
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_get_stats(o->l, &st, sums, ns);
    if (rc != PL_OK) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        pypl_raise(rc, err);
        goto done;
    }
    d = Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:d,s:L}", "steps", (long long)st.steps,
                      "micro_batches", (long long)st.micro_batches, "tokens",
                      (long long)st.tokens, "padding_tokens", (long long)st.padding_tokens,
                      "skipped", (long long)st.skipped, "max_over_mean", st.max_over_mean,
                      "max_over_lower_bound", st.max_over_lower_bound, "data_wait_s",
                      st.data_wait_s, "images_replaced", (long long)st.images_replaced);
    srcs = d ? PyDict_New() : NULL;
    if (!srcs) goto fail;
    for (int64_t i = 0; i < st.n_sources; i++) {
        const pl_source_summary *s = &st.sources[i];
        PyObject *e = Py_BuildValue(
            "{s:L,s:L,s:L,s:L,s:d,s:d}", "documents", (long long)s->documents, "tokens",
            (long long)s->tokens, "epochs_completed", (long long)s->epochs_completed,
            "skipped", (long long)s->skipped, "realized_fraction", s->realized_fraction,
            "scheduled_fraction", s->scheduled_fraction);
        if (!e || PyDict_SetItemString(srcs, s->name, e) < 0) {
            Py_XDECREF(e);
            goto fail;
        }
        Py_DECREF(e);
    }
    if (PyDict_SetItemString(d, "sources", srcs) < 0) goto fail;
    Py_DECREF(srcs);
    goto done;
fail:
    Py_XDECREF(srcs);
    Py_CLEAR(d);
done:
    PyMem_Free(sums);
    pthread_rwlock_unlock(&o->lock);
    return d;
}

/* want_step(timeout_ms=-1) -> int, None (timeout) or 'done' (external mode). */
static PyObject *loader_want_step(PyPlLoader *o, PyObject *args) {
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|L:want_step", &timeout)) return NULL;
    if (loader_rdlock(o)) return NULL;
    int64_t step = 0;
    char err[PL_ERRMSG_MAX];
    err[0] = '\0';
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_want_step(o->l, timeout, &step);
    if (rc < 0 && rc != PL_ETIMEDOUT) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (rc == PL_OK) return PyLong_FromLongLong((long long)step);
    if (rc == PL_DONE) return PyUnicode_FromString("done");
    if (rc == PL_ETIMEDOUT) Py_RETURN_NONE;
    return pypl_raise(rc, err[0] ? err : "loader: stopped");
}

/* want_steps(timeout_ms, ahead, low) -> (first, count), None (timeout) or 'done'. */
static PyObject *loader_want_steps(PyPlLoader *o, PyObject *args) {
    long long timeout = -1, ahead = 1, low = 0;
    if (!PyArg_ParseTuple(args, "LLL:want_steps", &timeout, &ahead, &low)) return NULL;
    if (loader_rdlock(o)) return NULL;
    int64_t first = 0, count = 0;
    char err[PL_ERRMSG_MAX];
    err[0] = '\0';
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_want_steps(o->l, timeout, ahead, low, &first, &count);
    if (rc < 0 && rc != PL_ETIMEDOUT) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (rc == PL_OK) return Py_BuildValue("LL", (long long)first, (long long)count);
    if (rc == PL_DONE) return PyUnicode_FromString("done");
    if (rc == PL_ETIMEDOUT) Py_RETURN_NONE;
    return pypl_raise(rc, err[0] ? err : "loader: stopped");
}

static PyObject *loader_push_package(PyPlLoader *o, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    if (loader_rdlock(o)) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char err[PL_ERRMSG_MAX];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_push_package(o->l, v.buf, (size_t)v.len);
    if (rc) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    PyBuffer_Release(&v);
    if (rc != PL_OK) return pypl_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *loader_position(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    if (loader_rdlock(o)) return NULL;
    int64_t step = 0, mb = 0;
    int have = 0;
    pl_loader_position(o->l, &step, &mb, &have);
    pthread_rwlock_unlock(&o->lock);
    return Py_BuildValue("LLO", (long long)step, (long long)mb, have ? Py_True : Py_False);
}

static PyObject *loader_attach_state(PyPlLoader *o, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    if (loader_rdlock(o)) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char err[PL_ERRMSG_MAX];
    int rc = pl_loader_attach_state(o->l, v.buf, (size_t)v.len);
    if (rc) snprintf(err, sizeof err, "%s", pl_loader_errmsg(o->l));
    pthread_rwlock_unlock(&o->lock);
    PyBuffer_Release(&v);
    if (rc != PL_OK) return pypl_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *loader_fail_step(PyPlLoader *o, PyObject *args) {
    long long step;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "Lis:fail_step", &step, &code, &msg)) return NULL;
    if (loader_rdlock(o)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_loader_fail_step(o->l, step, code, msg);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    if (rc != PL_OK) return pypl_raise(rc, "loader: fail_step: a step not asked for");
    Py_RETURN_NONE;
}

static PyObject *loader_stop(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    if (loader_rdlock(o)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pl_loader_stop(o->l);
    Py_END_ALLOW_THREADS
    pthread_rwlock_unlock(&o->lock);
    Py_RETURN_NONE;
}

static PyObject *loader_enter(PyPlLoader *o, PyObject *unused) {
    (void)unused;
    return Py_NewRef((PyObject *)o);
}

static PyObject *loader_exit(PyPlLoader *o, PyObject *args) {
    (void)args;
    PyObject *r = loader_close(o, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *loader_get_ranks(PyPlLoader *o, void *c) {
    (void)c;
    PyObject *t = PyTuple_New(o->n_ranks);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < o->n_ranks; i++) {
        PyObject *v = PyLong_FromLongLong((long long)o->ranks[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *loader_get_closed(PyPlLoader *o, void *c) {
    (void)c;
    return PyBool_FromLong(o->l == NULL);
}

static PyObject *loader_get_pid(PyPlLoader *o, void *c) {
    (void)c;
    return PyLong_FromLong((long)o->pid);
}

static PyMethodDef loader_methods[] = {
    {"create", (PyCFunction)(void (*)(void))loader_create,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Loader.create(config, ranks=None, threads=0, prefetch=0, external=False, unit=0,\n"
     "max_lag_steps=0) -> Loader\n\n"
     "An embedded loader serving global `ranks` (None: all ranks of the topology).\n"
     "threads/prefetch/max_lag_steps 0 take the config's values; unit: micro-batches per\n"
     "hand-off (0: automatic).  Opens every source: raises PolyloadIOError, FormatError\n"
     "or ConfigError.  external=True: no sources (steps come as packages; see want_step)."},
    {"next", (PyCFunction)loader_next, METH_O,
     "next(rank) -> Batch or None\n\nThe next micro-batch of global `rank`; None after "
     "train_steps.\nBlocks (without the GIL) until it is built.  Raises RangeError for "
     "a rank\nnot served, or the error of the worker that built the batch (after which\n"
     "the loader has failed: later calls raise PolyloadError ECLOSED)."},
    {"next_dict", (PyCFunction)(void (*)(void))loader_next_dict, METH_FASTCALL,
     "next_dict(rank, export) -> dict or None\n\nnext(rank) and Batch.to_dict(convert, "
     "writable=writable, dlpack=dlpack)\nin one call, export being the tuple (convert, "
     "writable, dlpack); no Batch\nobject is made.  None after train_steps; raises as "
     "next() and to_dict()."},
    {"get_state", (PyCFunction)loader_get_state, METH_NOARGS,
     "get_state() -> bytes\n\nThe state blob (SPEC section 4) after the batches consumed "
     "so far."},
    {"set_state", (PyCFunction)loader_set_state, METH_O,
     "set_state(blob)\n\nContinue from a state blob; drops prefetched batches.  Raises\n"
     "StateError naming a changed fingerprint field or a corrupt blob."},
    {"stats", (PyCFunction)loader_stats, METH_NOARGS,
     "stats() -> dict\n\n{'steps', 'micro_batches', 'tokens', 'padding_tokens', "
     "'skipped',\n'max_over_mean', 'max_over_lower_bound', 'data_wait_s', 'images_replaced',\n"
     "'sources': {name: {'documents',\n"
     "'tokens', 'epochs_completed', 'skipped', 'realized_fraction', "
     "'scheduled_fraction'}}}."},
    {"want_step", (PyCFunction)loader_want_step, METH_VARARGS,
     "want_step(timeout_ms=-1) -> int, None or 'done'\n\nExternal loaders: the step to "
     "fetch next (pl_loader_want_step); None\nwhen the timeout passed; 'done' after "
     "train_steps.  PolyloadError ECLOSED after\nstop() or a failure."},
    {"want_steps", (PyCFunction)loader_want_steps, METH_VARARGS,
     "want_steps(timeout_ms, ahead, low) -> (first, count), None or 'done'\n\n"
     "External loaders: the steps to push now, in order, without asking again\n"
     "(pl_loader_want_steps): up to `ahead` past the step built next; the next\n"
     "call returns once no more than `low` are.  None when the timeout passed;\n"
     "'done' after train_steps.  PolyloadError ECLOSED after stop() or a failure,\n"
     "EINVAL unless 1 <= ahead and 0 <= low <= ahead."},
    {"push_package", (PyCFunction)loader_push_package, METH_O,
     "push_package(package)\n\nHand over the package of the step want_step gave "
     "(PLPK bytes; for step\ntrain_steps its state blob).  PolyloadError EINVAL when "
     "corrupt or for another\nrank, step or config."},
    {"position", (PyCFunction)loader_position, METH_NOARGS,
     "position() -> (step, micro_batch, have_blob)\n\nThe consumed position and whether "
     "the loader holds the state blob of its\nstep's start (pl_loader_position)."},
    {"attach_state", (PyCFunction)loader_attach_state, METH_O,
     "attach_state(blob)\n\nExternal loaders whose packages carry no state: the state "
     "blob of a step's\nstart (pl_loader_attach_state).  Until then get_state and stats "
     "raise\nStateError.  StateError for a corrupt blob or one not at a step's start."},
    {"fail_step", (PyCFunction)loader_fail_step, METH_VARARGS,
     "fail_step(step, code, message)\n\nThe step could not be fetched: the rank that "
     "reaches it gets the error."},
    {"stop", (PyCFunction)loader_stop, METH_NOARGS,
     "stop()\n\nWake every waiting call with ECLOSED until set_state (pl_loader_stop)."},
    {"close", (PyCFunction)loader_close, METH_NOARGS,
     "close()\n\nStop the workers and free the loader.  Batches already returned stay "
     "valid.\nIdempotent.  In a forked child it only forgets the parent's loader."},
    {"__enter__", (PyCFunction)loader_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)loader_exit, METH_VARARGS, NULL},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef loader_getset[] = {
    {"ranks", (getter)loader_get_ranks, NULL, "tuple of int: the served global ranks", NULL},
    {"closed", (getter)loader_get_closed, NULL, "bool", NULL},
    {"pid", (getter)loader_get_pid, NULL, "int: the process that created the loader", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyPl_LoaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Loader",
    .tp_basicsize = sizeof(PyPlLoader),
    .tp_dealloc = (destructor)loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The embedded loader (pl_loader).  Create with Loader.create.\n\n"
              "next() may run concurrently for different ranks from several threads;\n"
              "other calls wait for them.  A context manager; close() is idempotent.",
    .tp_methods = loader_methods,
    .tp_getset = loader_getset,
};
