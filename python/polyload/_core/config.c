/*
 * config.c -- Config (pl_config).
 *
 * A Config is immutable except through set(); while another thread reads it
 * with the GIL released (a Loader or Planner being created from it), set()
 * raises instead of changing it under the reader.  The C objects created from
 * a Config share its pl_config (pypl_config_shared); set() and the other
 * setters copy it first while it is shared (config_writable).
 */
#include "core.h"


#include <string.h>

/* ------------------------------------------------------------- Config */

static PyObject *config_wrap(pl_config *cfg) {
    PyPlConfig *o = PyObject_New(PyPlConfig, &PyPl_ConfigType);
    if (!o) {
        pl_config_free(cfg);
        return NULL;
    }
    o->cfg = cfg;
    o->busy = 0;
    /* Raw text sources tokenize with Hugging Face tokenizers or tiktoken
       (tokenizer.c). */
    pl_config_set_tokenizer_factory_spec(cfg, pypl_tokenizer_factory, NULL);
    return (PyObject *)o;
}

/* Wrap the result of a parse: raise with the handle's message on failure. */
static PyObject *config_result(int rc, pl_config *cfg) {
    if (rc != PL_OK) {
        pypl_raise(rc, cfg ? pl_config_errmsg(cfg) : NULL);
        pl_config_free(cfg);
        return NULL;
    }
    return config_wrap(cfg);
}

static PyObject *config_parse_file(PyTypeObject *cls, PyObject *args) {
    (void)cls;
    PyObject *path_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&:parse_file", PyUnicode_FSConverter, &path_obj))
        return NULL;
    pl_config *cfg = NULL;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    rc = pl_config_parse_file(path, &cfg);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    return config_result(rc, cfg);
}

static PyObject *config_parse_string(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"text", "origin", NULL};
    const char *text, *origin = NULL;
    Py_ssize_t len;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s#|z:parse_string", kwlist, &text, &len,
                                     &origin))
        return NULL;
    pl_config *cfg = NULL;
    int rc = pl_config_parse_string(text, (size_t)len, origin, &cfg);
    return config_result(rc, cfg);
}

pl_config *pypl_config_shared(PyPlConfig *o) {
    pl_config_freeze(o->cfg);
    return o->cfg;
}

/* Before a setter changes o->cfg: a pl_config still held by a C object
 * is replaced by a private deep copy; one no object holds any more is
 * simply made writable again (pl_config_unshare; holders only ever leave:
 * new ones come through pypl_config_shared, under the GIL).  -1 with
 * MemoryError. */
static int config_writable(PyPlConfig *o) {
    if (pl_config_unshare(&o->cfg) != PL_OK) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void config_dealloc(PyPlConfig *o) {
    pl_config_free(o->cfg);
    PyObject_Free(o);
}

static PyObject *config_set(PyPlConfig *o, PyObject *args) {
    const char *key;
    PyObject *value;
    if (!PyArg_ParseTuple(args, "sO:set", &key, &value)) return NULL;
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Config.set: the config is being read by another thread");
        return NULL;
    }
    if (config_writable(o)) return NULL;
    PyObject *s;
    if (PyBool_Check(value)) s = PyUnicode_FromString(value == Py_True ? "true" : "false");
    else if (value == Py_None) s = PyUnicode_FromString("null");
    else s = PyObject_Str(value);
    if (!s) return NULL;
    const char *v = PyUnicode_AsUTF8(s);
    if (!v) {
        Py_DECREF(s);
        return NULL;
    }
    int rc = pl_config_set(o->cfg, key, v);
    Py_DECREF(s);
    if (rc != PL_OK) return pypl_raise(rc, pl_config_errmsg(o->cfg));
    Py_RETURN_NONE;
}

static PyObject *config_get_int(PyPlConfig *o, PyObject *args) {
    const char *key;
    if (!PyArg_ParseTuple(args, "s:get_int", &key)) return NULL;
    int64_t v = 0;
    int rc = pl_config_get_int(o->cfg, key, &v);
    if (rc != PL_OK) { /* the C call keeps no message (the config is const) */
        char msg[256];
        snprintf(msg, sizeof msg, "get_int: '%s' is not an integer key of the config", key);
        return pypl_raise(rc == PL_EINVAL ? PL_ECONFIG : rc, msg);
    }
    return PyLong_FromLongLong((long long)v);
}

/* The row of key `key` (pl_config_key_info), or NULL. */
static int key_row(const char *key, pl_config_key_row *row) {
    for (int64_t i = 0; i < pl_config_key_count(); i++) {
        memset(row, 0, sizeof *row);
        row->size = sizeof *row;
        if (pl_config_key_info(i, row) == PL_OK && strcmp(row->name, key) == 0) return 1;
    }
    return 0;
}

static PyObject *config_get(PyPlConfig *o, PyObject *args) {
    const char *key;
    if (!PyArg_ParseTuple(args, "s:get", &key)) return NULL;
    char buf[256];
    pl_config_key_row row;
    if (!key_row(key, &row) || !row.settable ||
        pl_config_get(o->cfg, key, buf, sizeof buf) != PL_OK) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "get: '%s' is not a scalar key of the config (polyload._core.config_keys() "
                 "lists them)",
                 key);
        return pypl_raise(PL_ECONFIG, msg);
    }
    if (strcmp(buf, "null") == 0) Py_RETURN_NONE;
    if (strstr(row.type, "integer") && strcmp(buf, "auto") != 0)
        return PyLong_FromString(buf, NULL, 10);
    if (strcmp(row.type, "number") == 0) return PyFloat_FromDouble(strtod(buf, NULL));
    if (strcmp(row.type, "fractions") == 0) {
        double f[3] = {0, 0, 0};
        char *p = buf;
        for (int k = 0; k < 3; k++) {
            f[k] = strtod(p, &p);
            if (*p == ',') p++;
        }
        return Py_BuildValue("(ddd)", f[0], f[1], f[2]);
    }
    return PyUnicode_FromString(buf);
}

static PyObject *str_or_none(const char *s) {
    if (s) return PyUnicode_FromString(s);
    Py_RETURN_NONE;
}

PyObject *pypl_config_keys(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int64_t i = 0; i < pl_config_key_count(); i++) {
        pl_config_key_row k;
        memset(&k, 0, sizeof k);
        k.size = sizeof k;
        if (pl_config_key_info(i, &k) != PL_OK) break;
        int is_int = strncmp(k.type, "integer", 7) == 0;
        PyObject *values = Py_None;
        Py_INCREF(values);
        if (k.values) {
            Py_DECREF(values);
            values = PyList_New(0);
            for (int j = 0; values && k.values[j]; j++) {
                PyObject *v = PyUnicode_FromString(k.values[j]);
                if (!v || PyList_Append(values, v) < 0) Py_CLEAR(values);
                Py_XDECREF(v);
            }
        }
        PyObject *d = PyDict_New();
        if (!d || !values || pypl_dict_steal(d, "values", values) ||
            pypl_dict_steal(d, "name", PyUnicode_FromString(k.name)) ||
            pypl_dict_steal(d, "type", PyUnicode_FromString(k.type)) ||
            pypl_dict_steal(d, "default", str_or_none(k.default_value)) ||
            pypl_dict_steal(d, "min", is_int ? PyLong_FromLongLong((long long)k.min)
                                              : str_or_none(NULL)) ||
            pypl_dict_steal(d, "max", is_int ? PyLong_FromLongLong((long long)k.max)
                                              : str_or_none(NULL)) ||
            pypl_dict_steal(d, "settable", PyBool_FromLong(k.settable)) ||
            pypl_dict_steal(d, "doc", PyUnicode_FromString(k.doc)) ||
            PyList_Append(list, d) < 0) {
            if (!d) Py_XDECREF(values);
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(d);
    }
    return list;
}

PyObject *pypl_source_types(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int t = 1;; t++) {
        pl_source_type_row r;
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        if (pl_source_type_info((pl_source_type)t, &r) != PL_OK) break;
        PyObject *d = PyDict_New();
        if (!d || pypl_dict_steal(d, "name", PyUnicode_FromString(r.name)) ||
            pypl_dict_steal(d, "code", PyLong_FromLong(t)) ||
            pypl_dict_steal(d, "raw_text", PyBool_FromLong(r.raw_text)) ||
            pypl_dict_steal(d, "index", PyUnicode_FromString(r.index)) ||
            pypl_dict_steal(d, "doc", PyUnicode_FromString(r.doc)) ||
            PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(d);
    }
    return list;
}

static int config_index(PyPlConfig *o, long long i) {
    if (i < 0 || i >= pl_config_num_sources(o->cfg)) {
        char msg[96];
        snprintf(msg, sizeof msg, "source index %lld out of range [0, %lld)", i,
                 (long long)pl_config_num_sources(o->cfg));
        pypl_raise(PL_ERANGE, msg);
        return -1;
    }
    return 0;
}

static PyObject *config_source_name(PyPlConfig *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (config_index(o, i)) return NULL;
    return PyUnicode_FromString(pl_config_source_name(o->cfg, i));
}

static PyObject *config_source_path(PyPlConfig *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (config_index(o, i)) return NULL;
    return PyUnicode_DecodeFSDefault(pl_config_source_path(o->cfg, i));
}

static PyObject *config_source_weight(PyPlConfig *o, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"i", "step", NULL};
    long long i, step = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|L:source_weight", kwlist, &i, &step))
        return NULL;
    if (config_index(o, i)) return NULL;
    return PyFloat_FromDouble(pl_config_source_weight(o->cfg, i, step));
}

static PyObject *config_get_num_sources(PyPlConfig *o, void *c) {
    (void)c;
    return PyLong_FromLongLong((long long)pl_config_num_sources(o->cfg));
}

static PyObject *config_get_sources(PyPlConfig *o, void *c) {
    (void)c;
    int64_t n = pl_config_num_sources(o->cfg);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *d = PyDict_New();
        if (!d || pypl_dict_steal(d, "name",
                                  PyUnicode_FromString(pl_config_source_name(o->cfg, i))) ||
            pypl_dict_steal(d, "path",
                            PyUnicode_DecodeFSDefault(pl_config_source_path(o->cfg, i))) ||
            pypl_dict_steal(d, "weight",
                            PyFloat_FromDouble(pl_config_source_weight(o->cfg, i, 0)))) {
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    return list;
}

static PyObject *config_fingerprint(PyPlConfig *o, PyObject *unused) {
    (void)unused;
    return PyLong_FromUnsignedLongLong((unsigned long long)pl_config_fingerprint(o->cfg));
}

static PyObject *config_world_size(PyPlConfig *o, PyObject *unused) {
    (void)unused;
    return PyLong_FromLongLong((long long)pl_config_world_size(o->cfg));
}

static PyObject *config_set_world_size(PyPlConfig *o, PyObject *arg) {
    long long world = PyLong_AsLongLong(arg);
    if (world == -1 && PyErr_Occurred()) return NULL;
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Config.set_world_size: the config is being read by another thread");
        return NULL;
    }
    if (config_writable(o)) return NULL;
    int rc = pl_config_set_world_size(o->cfg, (int64_t)world);
    if (rc != PL_OK) return pypl_raise(rc, pl_config_errmsg(o->cfg));
    Py_RETURN_NONE;
}

static PyObject *config_split(PyPlConfig *o, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int split = strcmp(name, "valid") == 0 || strcmp(name, "validation") == 0 ? PL_SPLIT_VALID
                : strcmp(name, "test") == 0                                  ? PL_SPLIT_TEST
                                                                             : -1;
    if (split < 0) {
        PyErr_Format(PyExc_ValueError, "Config.split: '%s' is not 'valid' or 'test'", name);
        return NULL;
    }
    pl_config *out = NULL;
    int rc = pl_config_split(o->cfg, split, &out);
    if (rc == PL_EINVAL && !out)
        return pypl_raise(PL_ECONFIG, "Config.split: this config is itself a split's");
    return config_result(rc, out);
}

static PyObject *config_get_warnings(PyPlConfig *o, void *c) {
    (void)c;
    int64_t n = pl_config_num_warnings(o->cfg);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *w = PyUnicode_DecodeUTF8(pl_config_warning(o->cfg, i),
                                           (Py_ssize_t)strlen(pl_config_warning(o->cfg, i)),
                                           "replace");
        if (!w) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, w);
    }
    return list;
}

static PyObject *config_rank_info(PyPlConfig *o, PyObject *arg) {
    long long rank = PyLong_AsLongLong(arg);
    if (rank == -1 && PyErr_Occurred()) return NULL;
    pl_rank_info ri;
    int rc = pl_config_rank_info(o->cfg, rank, &ri);
    if (rc != PL_OK) {
        char msg[256];
        int64_t t[4] = {0, 0, 0, 0};
        pl_config_get_int(o->cfg, "topology.dp", &t[0]);
        pl_config_get_int(o->cfg, "topology.pp", &t[1]);
        pl_config_get_int(o->cfg, "topology.cp", &t[2]);
        pl_config_get_int(o->cfg, "topology.tp", &t[3]);
        snprintf(msg, sizeof msg,
                 "rank %lld out of range [0, %lld): the topology is dp=%lld pp=%lld "
                 "cp=%lld tp=%lld",
                 rank, (long long)pl_config_world_size(o->cfg), (long long)t[0],
                 (long long)t[1], (long long)t[2], (long long)t[3]);
        const char *m = pl_config_errmsg(o->cfg);
        return pypl_raise(rc, rc == PL_ERANGE || !*m ? msg : m);
    }
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:k}", "rank", (long long)ri.rank,
                         "dp_rank", (long long)ri.dp_rank, "pp_rank", (long long)ri.pp_rank,
                         "cp_rank", (long long)ri.cp_rank, "tp_rank", (long long)ri.tp_rank,
                         "fields", (unsigned long)ri.fields);
}

static PyObject *config_set_lengths_provider(PyPlConfig *o, PyObject *fn) {
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_lengths_provider: fn must be callable");
        return NULL;
    }
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Config.set_lengths_provider: the config is being read by another "
                        "thread");
        return NULL;
    }
    if (config_writable(o)) return NULL;
    /* Sources and planners made from this config (copies included) call fn for
       as long as they live: the reference is kept for the process's life. */
    Py_INCREF(fn);
    pl_config_set_lengths_provider(o->cfg, pypl_lengths_provider, fn);
    Py_RETURN_NONE;
}

static PyObject *config_open_source(PyPlConfig *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (config_index(o, i)) return NULL;
    pl_source *src = NULL;
    int rc;
    o->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_config_open_source(o->cfg, i, &src);
    Py_END_ALLOW_THREADS
    o->busy--;
    if (rc != PL_OK) {
        pypl_raise(rc, src ? pl_source_errmsg(src) : NULL);
        pl_source_free(src);
        return NULL;
    }
    return pypl_source_wrap(src);
}

static PyObject *config_cost_sequence(PyPlConfig *o, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "cost_sequence: doc_lengths must be a sequence of int");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *lens = PyMem_Calloc((size_t)(n ? n : 1), sizeof *lens);
    if (!lens) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(lens);
            Py_DECREF(seq);
            return NULL;
        }
        lens[i] = v;
    }
    Py_DECREF(seq);
    double cost = pl_cost_sequence(o->cfg, lens, (int64_t)n);
    PyMem_Free(lens);
    return PyFloat_FromDouble(cost);
}

static PyObject *config_get_errmsg(PyPlConfig *o, void *c) {
    (void)c;
    return PyUnicode_FromString(pl_config_errmsg(o->cfg));
}

static PyMethodDef config_methods[] = {
    {"parse_file", (PyCFunction)config_parse_file, METH_VARARGS | METH_CLASS,
     "Config.parse_file(path) -> Config\n\nParse a YAML config file (SPEC section 5).\n"
     "Raises ConfigError naming the key and line; PolyloadIOError if unreadable."},
    {"parse_string", (PyCFunction)(void (*)(void))config_parse_string,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Config.parse_string(text, origin=None) -> Config\n\nParse YAML text; `origin` "
     "names it in messages.  Relative paths are relative to the current directory."},
    {"split", (PyCFunction)config_split, METH_O,
     "split(name) -> Config\n\nA new config for one evaluation pass over the 'valid' or "
     "'test' data (config `split`, or valid_sources / test_sources): every document of "
     "the split once, in index order within a source, then the end (pl_config_split).  "
     "Raises ConfigError when the config has none."},
    {"set", (PyCFunction)config_set, METH_VARARGS,
     "set(key, value)\n\nOverride one scalar key ('threads', 'topology.dp', ...) with a "
     "value written as in YAML (str, int, float or bool).  Raises ConfigError."},
    {"get", (PyCFunction)config_get, METH_VARARGS,
     "get(key) -> int | float | str | tuple | None\n\nRead a top-level scalar key "
     "(polyload._core.config_keys() lists them, 'settable'): an integer key as int, a "
     "number as float, split as (train, valid, test) fractions, other keys as str as "
     "YAML writes them ('best_fit', 'auto'); None while unset.  Raises ConfigError "
     "for another key."},
    {"get_int", (PyCFunction)config_get_int, METH_VARARGS,
     "get_int(key) -> int\n\nRead a scalar key as an integer ('seq_length', "
     "'topology.dp').  Raises ConfigError for an unknown key."},
    {"source_name", (PyCFunction)config_source_name, METH_O, "source_name(i) -> str"},
    {"source_path", (PyCFunction)config_source_path, METH_O,
     "source_path(i) -> str, as written in the config"},
    {"source_weight", (PyCFunction)(void (*)(void))config_source_weight,
     METH_VARARGS | METH_KEYWORDS,
     "source_weight(i, step=0) -> float\n\nNormalized weight of source i at `step`."},
    {"fingerprint", (PyCFunction)config_fingerprint, METH_NOARGS,
     "fingerprint() -> int\n\nA 64-bit hash of every setting that decides the batches\n"
     "(all keys but threads and prefetch): equal configs, equal batches."},
    {"world_size", (PyCFunction)config_world_size, METH_NOARGS,
     "world_size() -> int\n\ndp * pp * cp * tp."},
    {"set_world_size", (PyCFunction)config_set_world_size, METH_O,
     "set_world_size(n)\n\nFit the topology to the trainer's world size: with "
     "topology.dp: auto,\ndp = n / (pp*cp*tp); otherwise check dp*pp*cp*tp == n.  "
     "Raises ConfigError\nnaming both numbers (pl_config_set_world_size)."},
    {"rank_info", (PyCFunction)config_rank_info, METH_O,
     "rank_info(rank) -> dict\n\n{'rank', 'dp_rank', 'pp_rank', 'cp_rank', 'tp_rank', "
     "'fields'} of a global rank (Megatron's RankGenerator order).  Raises RangeError."},
    {"set_lengths_provider", (PyCFunction)config_set_lengths_provider, METH_O,
     "set_lengths_provider(fn)\n\nRaw text sources opened from this config afterwards "
     "hold lengths only:\nfn(source_index, [document indices]) -> (lengths, {position: "
     "message}) gives them\n(a negative length is a PL_E* code of a bad document), "
     "called from the sources'\nthreads in batches (pl_config_set_lengths_provider)."},
    {"open_source", (PyCFunction)config_open_source, METH_O,
     "open_source(i) -> Source\n\nOpen source i with the options of the config."},
    {"cost_sequence", (PyCFunction)config_cost_sequence, METH_O,
     "cost_sequence(doc_lengths) -> float\n\nThe cost model's estimate (SPEC section 5) "
     "for one sequence\npacking documents of these lengths (tokens)."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef config_getset[] = {
    {"num_sources", (getter)config_get_num_sources, NULL, "int: number of sources", NULL},
    {"sources", (getter)config_get_sources, NULL,
     "list of dict: {'name', 'path', 'weight' (normalized, at step 0)} per source", NULL},
    {"errmsg", (getter)config_get_errmsg, NULL, "str: the last error message", NULL},
    {"warnings", (getter)config_get_warnings, NULL,
     "list of str: what the parse accepted but may not be meant (pl_config_warning)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyPl_ConfigType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Config",
    .tp_basicsize = sizeof(PyPlConfig),
    .tp_dealloc = (destructor)config_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A parsed configuration (pl_config).  Create with Config.parse_file or\n"
              "Config.parse_string.",
    .tp_methods = config_methods,
    .tp_getset = config_getset,
};
