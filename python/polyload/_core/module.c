/*
 * module.c -- the polyload._core module: initialization (with the check of
 * the library version against the header), constants, module functions and
 * the one mapping from status codes to exceptions.
 */
#include "core.h"

#include <ctype.h>

#include <pthread.h>

#include <errno.h>
#include <string.h>

/* ------------------------------------------------------------- errors */

/* Classes from polyload._errors, owned by the module (kept for its life). */
static PyObject *pypl_exc_base, *pypl_exc_format, *pypl_exc_config,
    *pypl_exc_state, *pypl_exc_io, *pypl_exc_range, *pypl_exc_timeout, *pypl_exc_lag;

static PyObject *pypl_class_of(int rc) {
    switch (rc) {
    case PL_EMAGIC: case PL_EVERSION: case PL_EDTYPE: case PL_ECOUNT:
    case PL_EBOUNDS: case PL_ETRUNC: case PL_EDOCIDX: case PL_ERECORD: case PL_EIMAGE:
        return pypl_exc_format;
    case PL_ECONFIG: case PL_ETOPOLOGY:
        return pypl_exc_config;
    case PL_ESTATE:
        return pypl_exc_state;
    case PL_EIO: case PL_ENOENT:
        return pypl_exc_io;
    case PL_ERANGE:
        return pypl_exc_range;
    case PL_ETIMEDOUT:
        return pypl_exc_timeout;
    case PL_ELAG:
        return pypl_exc_lag;
    default: /* EINVAL, ENOMEM, ECLOSED and codes of newer libraries */
        return pypl_exc_base;
    }
}

PyObject *pypl_raise(int rc, const char *msg) {
    if (!msg || !*msg) msg = pl_strerror(rc);
    PyObject *cls = pypl_class_of(rc);
    if (!cls) { /* module not initialized: should not happen */
        PyErr_Format(PyExc_RuntimeError, "polyload: %s: %s", pl_err_name(rc), msg);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunction(cls, "iss", rc, pl_err_name(rc), msg);
    if (!exc) return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

int pypl_errors_init(PyObject *module) {
    PyObject *m = PyImport_ImportModule("polyload._errors");
    if (!m) return -1;
    struct { PyObject **slot; const char *name; } tab[] = {
        {&pypl_exc_base, "PolyloadError"}, {&pypl_exc_format, "FormatError"},
        {&pypl_exc_config, "ConfigError"}, {&pypl_exc_state, "StateError"},
        {&pypl_exc_io, "PolyloadIOError"}, {&pypl_exc_range, "RangeError"},
        {&pypl_exc_timeout, "PolyloadTimeoutError"}, {&pypl_exc_lag, "LagError"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        PyObject *cls = PyObject_GetAttrString(m, tab[i].name);
        if (!cls) {
            Py_DECREF(m);
            return -1;
        }
        *tab[i].slot = cls; /* one reference, held for the process's life */
        if (PyModule_AddObjectRef(module, tab[i].name, cls) < 0) {
            Py_DECREF(m);
            return -1;
        }
    }
    Py_DECREF(m);
    return 0;
}

PyObject *pypl_sized_bytes(pypl_sized_fn fn, void *ctx, int *rc) {
    size_t n = 0;
    Py_BEGIN_ALLOW_THREADS
    *rc = fn(ctx, NULL, 0, &n);
    Py_END_ALLOW_THREADS
    for (int tries = 0; *rc == PL_OK && tries < 8; tries++) {
        size_t cap = n + 4096;
        PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
        if (!b) return NULL;
        char *buf = PyBytes_AS_STRING(b);
        Py_BEGIN_ALLOW_THREADS
        *rc = fn(ctx, buf, cap, &n);
        Py_END_ALLOW_THREADS
        if (*rc == PL_OK) {
            if (_PyBytes_Resize(&b, (Py_ssize_t)n) < 0) return NULL;
            return b;
        }
        Py_DECREF(b);
        if (*rc == PL_EINVAL && n > cap) *rc = PL_OK; /* grew meanwhile: again */
    }
    if (*rc == PL_OK) *rc = PL_EINVAL; /* kept growing */
    return NULL;
}

PyObject *pypl_no_reduce(PyObject *self, PyObject *unused) {
    (void)unused;
    PyErr_Format(PyExc_TypeError,
                 "cannot pickle polyload._core.%s: handles hold C state of this "
                 "process; pass the config and create the object where it is used",
                 Py_TYPE(self)->tp_name + strlen("polyload._core."));
    return NULL;
}

int pypl_dict_steal(PyObject *d, const char *key, PyObject *value) {
    if (!value) return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* ------------------------------------------------------------- dtypes */

int pypl_parse_dtype(PyObject *obj, pl_dtype *out) {
    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (pl_dtype_size((int)v) == 0 || v != (int)v) {
            PyErr_Format(PyExc_ValueError, "unknown dtype code %ld", v);
            return -1;
        }
        *out = (pl_dtype)v;
        return 0;
    }
    PyObject *s = PyObject_Str(obj); /* accepts numpy dtypes and types by name */
    if (!s) return -1;
    const char *name = PyUnicode_AsUTF8(s);
    if (!name) {
        Py_DECREF(s);
        return -1;
    }
    /* str(np.dtype("int64")) is "int64"; str(np.int64) is "<class 'numpy.int64'>" */
    const char *dot = strrchr(name, '.');
    char buf[32];
    snprintf(buf, sizeof buf, "%s", dot ? dot + 1 : name);
    char *q = strchr(buf, '\'');
    if (q) *q = '\0';
    for (int code = 1; code <= 9; code++) {
        if (strcmp(buf, pl_dtype_name(code)) == 0) {
            Py_DECREF(s);
            *out = (pl_dtype)code;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown dtype %R", obj);
    Py_DECREF(s);
    return -1;
}

/* ------------------------------------------------------------ functions */

static PyObject *m_version_number(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(pl_version_number());
}

static PyObject *m_version_string(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(pl_version_string());
}

static int pypl_int_arg(PyObject *arg, int *out) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int)v;
    return 0;
}

static PyObject *m_strerror(PyObject *self, PyObject *arg) {
    (void)self;
    int code;
    if (pypl_int_arg(arg, &code)) return NULL;
    return PyUnicode_FromString(pl_strerror(code));
}

static PyObject *m_err_name(PyObject *self, PyObject *arg) {
    (void)self;
    int code;
    if (pypl_int_arg(arg, &code)) return NULL;
    return PyUnicode_FromString(pl_err_name(code));
}

static PyObject *m_dtype_size(PyObject *self, PyObject *arg) {
    (void)self;
    pl_dtype d;
    if (pypl_parse_dtype(arg, &d)) return NULL;
    return PyLong_FromSize_t(pl_dtype_size(d));
}

static PyObject *m_dtype_name(PyObject *self, PyObject *arg) {
    (void)self;
    int code;
    if (pypl_int_arg(arg, &code)) return NULL;
    return PyUnicode_FromString(pl_dtype_name(code));
}

/* raise_status(code, message=None): raise the exception for a status code,
 * through the same mapping the handles use (for tests and pure-Python
 * layers). */
static PyObject *m_raise_status(PyObject *self, PyObject *args) {
    (void)self;
    int code;
    const char *msg = NULL;
    if (!PyArg_ParseTuple(args, "i|z:raise_status", &code, &msg)) return NULL;
    if (code >= 0) {
        PyErr_Format(PyExc_ValueError, "status %d is not an error", code);
        return NULL;
    }
    return pypl_raise(code, msg);
}

/* Copy a sequence of numbers into a new double array of *n elements. */
static double *pypl_doubles(PyObject *obj, const char *what, Py_ssize_t *n) {
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq) return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    double *v = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        v[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (v[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(v);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return v;
}

/* cost_fit(tokens, sum_sq, time) -> {"a", "b", "c", "r2"} (pl_cost_fit). */
static PyObject *m_cost_fit(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *t_obj, *s_obj, *y_obj;
    if (!PyArg_ParseTuple(args, "OOO:cost_fit", &t_obj, &s_obj, &y_obj)) return NULL;
    Py_ssize_t nt = 0, ns = 0, ny = 0;
    double *t = pypl_doubles(t_obj, "cost_fit: tokens must be a sequence", &nt);
    double *s = t ? pypl_doubles(s_obj, "cost_fit: sum_sq must be a sequence", &ns) : NULL;
    double *y = s ? pypl_doubles(y_obj, "cost_fit: time must be a sequence", &ny) : NULL;
    PyObject *r = NULL;
    if (y) {
        if (nt != ns || nt != ny) {
            PyErr_SetString(PyExc_ValueError, "cost_fit: columns of different lengths");
        } else {
            double a = 0, b = 0, c = 0, r2 = 0;
            int rc = pl_cost_fit(t, s, y, (int64_t)nt, &a, &b, &c, &r2);
            if (rc != PL_OK)
                pypl_raise(rc, "cost_fit: fewer than 3 rows, a value not finite, or "
                               "linearly dependent columns");
            else
                r = Py_BuildValue("{s:d,s:d,s:d,s:d}", "a", a, "b", b, "c", c, "r2", r2);
        }
    }
    PyMem_Free(t);
    PyMem_Free(s);
    PyMem_Free(y);
    return r;
}

static PyObject *m_smart_resize(PyObject *self, PyObject *args) {
    (void)self;
    long long h, w, f, mn, mx;
    if (!PyArg_ParseTuple(args, "LLLLL:smart_resize", &h, &w, &f, &mn, &mx)) return NULL;
    int64_t rh = 0, rw = 0;
    int rc = pl_image_smart_resize(h, w, f, mn, mx, &rh, &rw);
    if (rc) return pypl_raise(rc, "smart_resize: bad size or aspect ratio above 200");
    return Py_BuildValue("(LL)", (long long)rh, (long long)rw);
}

static PyObject *m_image_probe(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int64_t w = 0, h = 0;
    char err[256] = "";
    int rc = pl_image_probe(view.buf, (size_t)view.len, &w, &h, err, sizeof err);
    PyBuffer_Release(&view);
    if (rc) return pypl_raise(rc, err);
    return Py_BuildValue("(LL)", (long long)w, (long long)h);
}

static PyObject *mod_set_tokenize_threads(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_set_tokenize_threads(n < -1 || n > 100000 ? -1 : (int)n);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK)
        return pypl_raise(rc, rc == PL_EINVAL ? "set_tokenize_threads: 0..256 threads"
                                              : "set_tokenize_threads: cannot start a thread");
    Py_RETURN_NONE;
}

static PyObject *mod_tokenize_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(pl_tokenize_threads());
}

static PyObject *mod_cpus_available(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(pl_cpus_available());
}

static PyMethodDef module_methods[] = {
    {"cli_main", pypl_cli_main, METH_VARARGS,
     "cli_main(argv) -> int\n\nRun the polyload CLI (its arguments, without the program name) in "
     "this\nprocess, with the package's tokenizers (type hf, tiktoken); returns the exit "
     "status."},
    {"smart_resize", m_smart_resize, METH_VARARGS,
     "smart_resize(height, width, factor, min_pixels, max_pixels) -> (h, w)\n\n"
     "Qwen2-VL's smart_resize (pl_image_smart_resize)."},
    {"image_probe", m_image_probe, METH_O,
     "image_probe(data) -> (width, height)\n\nSize of a JPEG/PNG/WebP from its header, "
     "no decode (pl_image_probe).\nRaises FormatError."},
    {"state_info", pypl_state_info, METH_O,
     "state_info(blob) -> dict\n\nPosition and per-source counters of a state blob "
     "(pl_state_inspect,\npl_state_source): version, seed, step, micro_batch, dp, "
     "seq_length, ...,\nsources: [{name, path, num_documents, epoch, drawn_tokens, "
     "target_tokens,\ndocuments, skipped, ...}].  StateError when corrupt."},
    {"state_pack", pypl_state_pack, METH_O,
     "state_pack(blob) -> bytes\n\nA compact (zlib) copy of a state blob (pl_state_pack); "
     "StateError for a\ncorrupt blob."},
    {"state_unpack", pypl_state_unpack, METH_O,
     "state_unpack(packed) -> bytes\n\nThe state blob of a state_pack copy "
     "(pl_state_unpack); StateError for a\ncorrupt or truncated copy."},
    {"state_retarget", pypl_state_retarget, METH_VARARGS,
     "state_retarget(blob, micro_batch, dp) -> bytes\n\nThe blob with another cursor "
     "(pl_state_retarget)."},
    {"set_tokenize_threads", mod_set_tokenize_threads, METH_O,
     "set_tokenize_threads(n) -> None\n\nTokenize the raw text sources of this process "
     "on n shared threads, each\ntokenizer file on one of them (0: on the threads that "
     "need the tokens, the\ndefault); what a Ray source loader actor sets "
     "(pl_set_tokenize_threads)."},
    {"cpus_available", mod_cpus_available, METH_NOARGS,
     "cpus_available() -> int\n\nCPUs this process may use: its affinity mask under its "
     "cgroup's CPU quota\n(pl_cpus_available); `threads: auto` runs one less."},
    {"tokenize_threads", mod_tokenize_threads, METH_NOARGS,
     "tokenize_threads() -> int\n\nThe count last set (pl_tokenize_threads)."},
    {"read_rows_raw", pypl_read_rows_raw, METH_VARARGS,
     "read_rows_raw(sources, reads) -> (bytes, offsets)\n\nRows of several sources "
     "(sources[reads[i, 0]] a Source, others None) at their\nstored widths, back to back "
     "in row order (pl_source_read_raw); offsets: int64 Array\nof each row's byte "
     "offset.  What a source-loader actor answers, in one call."},
    {"read_rows_reply", pypl_read_rows_reply, METH_VARARGS,
     "read_rows_reply(sources, reads, source_ns=None) -> bytes\n\nThe reply of a source "
     "loader whose sources have images (pl_reply_encode):\ntokens of every row at stored "
     "width and the image of every row that holds\na webdataset sample's placeholder run, "
     "decoded and resized here.  Parsed\nin C by Pipeline.complete_replies.  source_ns: "
     "None, or a writable int64 array of\nlen(sources) to which the nanoseconds spent on "
     "each source's reads and images\nare added (pl_reply_encode_timed): how a loader "
     "hosting several sources\nsplits its CPU."},
    {"package_info", pypl_package_info, METH_O,
     "package_info(package) -> (step, dp_rank)\n\npl_package_inspect."},
    {"cost_fit", m_cost_fit, METH_VARARGS,
     "cost_fit(tokens, sum_sq, time) -> dict\n\nLeast-squares fit of time ~= a*tokens + "
     "b*sum_sq + c\n(`polyload calibrate`): {'a', 'b', 'c', 'r2'}.  PolyloadError EINVAL "
     "for\nfewer than 3 rows, non-finite values or linearly dependent columns."},
    {"version_number", m_version_number, METH_NOARGS,
     "version_number() -> int\n\nThe C library's version, MAJOR*10000 + MINOR*100 + PATCH."},
    {"version_string", m_version_string, METH_NOARGS,
     "version_string() -> str\n\nThe C library's version as 'MAJOR.MINOR.PATCH'."},
    {"config_keys", pypl_config_keys, METH_NOARGS,
     "config_keys() -> list of dict\n\nThe config key table (pl_config_key_info): "
     "{'name', 'type', 'default', 'min', 'max', 'values', 'settable', 'doc'} per key; "
     "'default' is None when unset, 'min'/'max' are None except for integer keys, "
     "'values' None except for keys that take one of a list."},
    {"source_types", pypl_source_types, METH_NOARGS,
     "source_types() -> list of dict\n\nThe source type table (pl_source_type_info): "
     "{'name', 'code', 'raw_text', 'index', 'doc'} per type, in code order."},
    {"strerror", m_strerror, METH_O,
     "strerror(code) -> str\n\nStatic description of a status code (pl_strerror)."},
    {"err_name", m_err_name, METH_O,
     "err_name(code) -> str\n\nName of a status code without prefix, e.g. 'EMAGIC'."},
    {"dtype_size", m_dtype_size, METH_O,
     "dtype_size(dtype) -> int\n\nBytes per element of a dtype (code or numpy name)."},
    {"dtype_name", m_dtype_name, METH_O,
     "dtype_name(code) -> str\n\nLower-case numpy name of a dtype code; 'unknown' if none."},
    {"raise_status", m_raise_status, METH_VARARGS,
     "raise_status(code, message=None)\n\nRaise the exception that status `code` maps to."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    "polyload._core",
    "polyload._core: the C library libpolyload, one to one (see polyload.h and\n"
    "polyload_experimental.h).\n\n"
    "Types: Config, Source, Loader, Batch, Array; Planner, Plan, Constructor,\n"
    "Pipeline, Work (the roles, experimental).  Status codes map to\n"
    "the exceptions of polyload._errors.  Use the friendly layer `polyload`.",
    -1,
    module_methods,
    NULL, NULL, NULL, NULL,
};

static int add_types(PyObject *m) {
    PyTypeObject *types[] = {&PyPl_ArrayType, &PyPl_BatchType, &PyPl_ConfigType,
                             &PyPl_SourceType, &PyPl_PlannerType, &PyPl_LoaderType,
                             &PyPl_PlanType, &PyPl_ConstructorType, &PyPl_PipelineType,
                             &PyPl_WorkType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (PyType_Ready(types[i]) < 0) return -1;
        const char *name = strrchr(types[i]->tp_name, '.') + 1;
        if (PyModule_AddObjectRef(m, name, (PyObject *)types[i]) < 0) return -1;
    }
    return 0;
}

static int add_constants(PyObject *m) {
#define PYPL_ADD_STATUS(name, value, desc)                                      \
    if (PyModule_AddIntConstant(m, #name, value) < 0) return -1;
    PL_STATUS_MAP(PYPL_ADD_STATUS)
#undef PYPL_ADD_STATUS
    struct { const char *name; long value; } tab[] = {
        {"VERSION_NUMBER", PL_VERSION_NUMBER},
        {"DTYPE_UINT8", PL_DTYPE_UINT8}, {"DTYPE_INT8", PL_DTYPE_INT8},
        {"DTYPE_INT16", PL_DTYPE_INT16}, {"DTYPE_INT32", PL_DTYPE_INT32},
        {"DTYPE_INT64", PL_DTYPE_INT64}, {"DTYPE_FLOAT64", PL_DTYPE_FLOAT64},
        {"DTYPE_FLOAT32", PL_DTYPE_FLOAT32}, {"DTYPE_UINT16", PL_DTYPE_UINT16},
        {"DTYPE_UINT32", PL_DTYPE_UINT32},
        {"IMAGE_FIXED", PL_IMAGE_FIXED}, {"IMAGE_NATIVE", PL_IMAGE_NATIVE},
        {"FIELD_INPUT_IDS", PL_FIELD_INPUT_IDS}, {"FIELD_LABELS", PL_FIELD_LABELS},
        {"FIELD_LOSS_MASK", PL_FIELD_LOSS_MASK},
        {"FIELD_POSITION_IDS", PL_FIELD_POSITION_IDS},
        {"FIELD_CU_SEQLENS", PL_FIELD_CU_SEQLENS},
        {"FIELD_MAX_SEQLEN", PL_FIELD_MAX_SEQLEN}, {"FIELD_ALL", PL_FIELD_ALL},
        {"CHUNK_DOC_END", PL_CHUNK_DOC_END},
        {"INDEX_WRITE", PL_INDEX_WRITE}, {"INDEX_READ", PL_INDEX_READ},
        {"INDEX_MEMORY", PL_INDEX_MEMORY},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (PyModule_AddIntConstant(m, tab[i].name, tab[i].value) < 0) return -1;
    /* SOURCE_<NAME> of every source type, from the source type table. */
    for (int t = 1;; t++) {
        pl_source_type_row r;
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        if (pl_source_type_info((pl_source_type)t, &r) != PL_OK) break;
        char name[64] = "SOURCE_";
        for (size_t k = 0; r.name[k] && k + 8 < sizeof name; k++)
            name[7 + k] = (char)toupper((unsigned char)r.name[k]);
        if (PyModule_AddIntConstant(m, name, t) < 0) return -1;
    }
    return PyModule_AddStringConstant(m, "VERSION", pl_version_string());
}

pid_t pypl_pid;
static void pypl_after_fork(void) { pypl_pid = getpid(); }

PyMODINIT_FUNC PyInit__core(void) {
    pypl_pid = getpid();
    static int atfork_done = 0;
    if (!atfork_done && pthread_atfork(NULL, NULL, pypl_after_fork) == 0) atfork_done = 1;
    if (pl_version_number() != PL_VERSION_NUMBER) {
        PyErr_Format(PyExc_ImportError,
                     "polyload._core was compiled against libpolyload %d but the "
                     "linked library is %d (%s)",
                     PL_VERSION_NUMBER, pl_version_number(), pl_version_string());
        return NULL;
    }
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    if (add_types(m) < 0 || add_constants(m) < 0 || pypl_errors_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
