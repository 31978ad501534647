/*
 * core.h -- declarations shared by the files of the polyload._core extension.
 *
 * polyload._core mirrors the public C API (include/polyload/polyload.h and
 * polyload_experimental.h; it includes no header of src/) one to one: a
 * Python type per handle, each in its own file (config.c Config, source.c
 * Source, planner.c Planner, loader.c Loader, plan.c Plan, constructor.c
 * Constructor, pipeline.c Pipeline and its Work, batch.c Batch for a
 * retained pl_batch), array.c Array, a buffer-protocol view of C memory that
 * NumPy and PyTorch wrap without copying, state.c the module functions over
 * state blobs and packages, tokenizer.c the tokenizer factory, module.c the
 * module.  Status codes become exceptions in
 * one place (pypl_raise); the exception classes live in polyload._errors.
 *
 * Every call that reads files, waits or computes runs with the GIL released.
 * Handles remember the process that created them: after os.fork the child
 * never frees (or uses) C state that belongs to the parent's threads.
 */
#ifndef PYPL_CORE_H
#define PYPL_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "polyload/polyload.h"
#include "polyload/polyload_experimental.h"

#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

/* Python 3.9 (pyproject's requires-python) lacks these 3.10 helpers. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *pypl_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) pypl_newref((PyObject *)(o))
static inline int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *v) {
    Py_INCREF(v);
    if (PyModule_AddObject(m, name, v) < 0) {
        Py_DECREF(v);
        return -1;
    }
    return 0;
}
#endif

/* The current process id, cached (getpid(2) is a system call, and handles
 * check it on every call to refuse use in a forked child); a pthread_atfork
 * child handler installed at import refreshes it. */
extern pid_t pypl_pid;
static inline pid_t pypl_getpid(void) { return pypl_pid; }

/* ------------------------------------------------------------- tokenizers */

/* The pl_tokenizer_factory of every Config (tokenizer.c): type "hf" through
 * Hugging Face `tokenizers`. */
int pypl_tokenizer_factory(void *ctx, const pl_tokenizer_spec *spec, pl_tokenizer *out,
                           char *err, size_t errcap);

/* Config.set_lengths_provider's pl_lengths_fn (tokenizer.c); ctx: the callable. */
int pypl_lengths_provider(void *ctx, int64_t source, int64_t n, const int64_t *index,
                          int64_t *lengths, char **messages, char *err, size_t errcap);

/* ------------------------------------------------------------- errors */

/* Raise the polyload exception for status `rc` (negative) with message
 * `msg` (the handle's errmsg; NULL or "" uses pl_strerror).  Returns NULL. */
PyObject *pypl_raise(int rc, const char *msg);
/* cli_main(argv: list[str]) -> int: the C CLI in this process (cli.c). */
PyObject *pypl_cli_main(PyObject *self, PyObject *args);
/* Import polyload._errors and keep its classes.  -1 with an exception set. */
int pypl_errors_init(PyObject *module);

/* The __reduce__ of every handle: handles are not picklable. */
PyObject *pypl_no_reduce(PyObject *self, PyObject *unused);

/* ------------------------------------------------------------- arrays */

extern PyTypeObject PyPl_ArrayType;
extern PyTypeObject PyPl_BatchType;
/* A non-NULL address for empty arrays (buffers must not be NULL; array.c). */
extern int64_t pypl_empty[1];

/*
 * An Array over the memory of a retained batch: takes its own
 * pl_batch_retain reference and releases it on dealloc.  format is a struct
 * code ("q", "i", "f", "d").  ndim is 1 or 2.  Exported read-only unless
 * writable (batch memory is shared by the ranks of a DP group).
 */
PyObject *pypl_array_from_batch(pl_batch *batch, void *data, const char *format,
                                Py_ssize_t itemsize, int ndim,
                                const Py_ssize_t *shape, int writable);
/* An Array that owns `data` (malloc'd; freed on dealloc, even on failure). */
PyObject *pypl_array_owned(void *data, const char *format, Py_ssize_t itemsize,
                           int ndim, const Py_ssize_t *shape);
/* A Batch holding one reference to `batch`, which the caller has retained
 * for it (the reference is released on failure too). */
PyObject *pypl_batch_new(pl_batch *batch);
/* The dict of a micro-batch as Batch.to_dict builds it (convert: a tuple of
 * callables or NULL/None; dlpack: a callable or NULL).  Takes no reference of
 * b: each exported field retains it.  New reference, or NULL. */
PyObject *pypl_batch_dict(pl_batch *batch, PyObject *convert, int writable, PyObject *dlpack);
/* 0 when pypl_batch_dict takes these arguments, else -1 with an exception. */
int pypl_batch_dict_check(PyObject *convert, int writable, PyObject *dlpack);

/* Struct code and numpy name of a token dtype (INT64/INT32 batches and
 * reads). */
const char *pypl_format_of(pl_dtype dtype);

/* ------------------------------------------------------------- handles */

typedef struct {
    PyObject_HEAD
    pl_config *cfg;
    int busy; /* > 0 while a call reads cfg with the GIL released */
} PyPlConfig;

/* The pl_config of a Config for creating a C object that keeps it (loader,
 * planner, pipeline, constructor): the Config's own, frozen
 * (pl_config_freeze), so that the object holds a reference to it instead of
 * keeping a deep copy of ~450 bytes per source.  A later set() on the Config
 * gives the Config a private copy first (copy on write, pl_config_unshare),
 * so the object never sees it. */
pl_config *pypl_config_shared(PyPlConfig *o);

typedef struct {
    PyObject_HEAD
    pl_source *src;
} PyPlSource;

extern PyTypeObject PyPl_ConfigType;
extern PyTypeObject PyPl_SourceType;
extern PyTypeObject PyPl_PlannerType;
extern PyTypeObject PyPl_LoaderType;

/* Parse a dtype argument: an int code or a numpy name ("uint16").  -1 with
 * an exception set on failure. */
int pypl_parse_dtype(PyObject *obj, pl_dtype *out);
/* Wrap an open source (steals the handle). */
PyObject *pypl_source_wrap(pl_source *src);

/* ------------------------------------------------------------- roles */

typedef struct {
    PyObject_HEAD
    pl_plan *plan;
} PyPlPlan;

extern PyTypeObject PyPl_PlanType;
extern PyTypeObject PyPl_ConstructorType;
extern PyTypeObject PyPl_PipelineType;
extern PyTypeObject PyPl_WorkType;

/* A C call with the cap/len convention (buf NULL: learn the size), run with
 * the GIL released.  fn(ctx, buf, cap, &len) returns a status. */
typedef int (*pypl_sized_fn)(void *ctx, void *buf, size_t cap, size_t *len);
/* Bytes from fn: sizes, then fills, again when the size grew in between
 * (another thread may move a loader's position).  NULL with *rc a negative
 * status (the caller raises), or NULL with *rc PL_OK and a Python error set. */
PyObject *pypl_sized_bytes(pypl_sized_fn fn, void *ctx, int *rc);

/* Module functions of state.c (state blobs, packages) and source.c (reads). */
PyObject *pypl_state_info(PyObject *self, PyObject *arg);
/* The key and source type tables (config.c). */
PyObject *pypl_config_keys(PyObject *self, PyObject *unused);
PyObject *pypl_source_types(PyObject *self, PyObject *unused);
PyObject *pypl_state_retarget(PyObject *self, PyObject *args);
PyObject *pypl_state_pack(PyObject *self, PyObject *arg);
PyObject *pypl_state_unpack(PyObject *self, PyObject *arg);
PyObject *pypl_package_info(PyObject *self, PyObject *arg);
PyObject *pypl_read_rows_raw(PyObject *self, PyObject *args);
PyObject *pypl_read_rows_reply(PyObject *self, PyObject *args);
/* Parse reads (an int64 buffer [n, 4]) into a PyMem array; *total: the sum
 * of counts (-1 when a count is negative or the sum overflows).  -1 with an
 * exception set. */
int pypl_parse_reads(PyObject *arg, const char *what, pl_read **out, int64_t *n,
                     int64_t *total);

/* The plan as a dict of ints and owned Arrays (Planner.next). */
PyObject *pypl_plan_to_dict(const pl_plan *pl);
/* Wrap a plan (steals it). */
PyObject *pypl_plan_wrap(pl_plan *pl);

/* Module-level helpers for building dicts: set d[key] = value, stealing
 * value.  -1 on failure. */
int pypl_dict_steal(PyObject *d, const char *key, PyObject *value);

#endif
