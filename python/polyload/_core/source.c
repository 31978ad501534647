/*
 * source.c -- Source (pl_source): open, lengths, reads (one document, many
 * ranges at int64 or at the stored width, the rows of a source-loader reply),
 * images, statistics; every call that reads runs with the GIL released.
 */
#include "core.h"

#include <string.h>

/* ------------------------------------------------------------- Source */

PyObject *pypl_source_wrap(pl_source *src) {
    PyPlSource *o = PyObject_New(PyPlSource, &PyPl_SourceType);
    if (!o) {
        pl_source_free(src);
        return NULL;
    }
    o->src = src;
    return (PyObject *)o;
}

static int parse_source_type(PyObject *obj, pl_source_type *out) {
    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v == -1 && PyErr_Occurred()) return -1;
        *out = (pl_source_type)v;
        return 0;
    }
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "source type must be a str or an int");
        return -1;
    }
    *out = pl_source_type_from_name(s); /* the source type table */
    if (!*out) {
        char names[256] = "";
        size_t used = 0;
        for (int t = 1; used < sizeof names && pl_source_type_name((pl_source_type)t); t++) {
            int w = snprintf(names + used, sizeof names - used, "%s%s", t > 1 ? ", " : "",
                             pl_source_type_name((pl_source_type)t));
            if (w < 0) break;
            used += (size_t)w;
        }
        PyErr_Format(PyExc_ValueError, "unknown source type '%s' (one of: %s)", s, names);
        return -1;
    }
    return 0;
}

/* pl_source_open without the GIL, wrapped as a Source; raises on error. */
static PyObject *source_open_wrap(const pl_source_options *o) {
    pl_source *src = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_open(o, &src);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        pypl_raise(rc, src ? pl_source_errmsg(src) : NULL);
        pl_source_free(src);
        return NULL;
    }
    return pypl_source_wrap(src);
}

static PyObject *source_open(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"type", "path", "name", "token_dtype", "eos_id",
                             "write_index", NULL};
    PyObject *type_obj, *path_obj = NULL, *dtype_obj = Py_None;
    const char *name = NULL;
    long long eos_id = -1;
    int write_index = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|zOLi:open", kwlist, &type_obj,
                                     PyUnicode_FSConverter, &path_obj, &name, &dtype_obj,
                                     &eos_id, &write_index))
        return NULL;
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    if (parse_source_type(type_obj, &o.type) ||
        (dtype_obj != Py_None && pypl_parse_dtype(dtype_obj, &o.token_dtype))) {
        Py_DECREF(path_obj);
        return NULL;
    }
    o.path = PyBytes_AS_STRING(path_obj);
    o.name = name;
    o.eos_id = eos_id;
    o.write_index = write_index;
    PyObject *r = source_open_wrap(&o);
    Py_DECREF(path_obj);
    return r;
}

static PyObject *source_open_webdataset(PyObject *cls, PyObject *args, PyObject *kw) {
    (void)cls;
    static char *kwlist[] = {"path", "token_id", "mode", "size", "patch_size",
                             "merge_size", "min_pixels", "max_pixels", "limit_pixels",
                             "caption", "caption_token_offset", "eos_id", "index",
                             "name", NULL};
    PyObject *path_obj = NULL;
    const char *mode = "fixed", *caption = "", *name = NULL;
    long long token_id = -1, size = 0, patch = 0, merge = 0, minp = 0, maxp = 0,
              limit = 0, offset = 0, eos_id = -1;
    int index = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&L|$sLLLLLLsLLiz:open_webdataset", kwlist,
                                     PyUnicode_FSConverter, &path_obj, &token_id, &mode,
                                     &size, &patch, &merge, &minp, &maxp, &limit, &caption,
                                     &offset, &eos_id, &index, &name))
        return NULL;
    pl_image_options io;
    memset(&io, 0, sizeof io);
    if (!strcmp(mode, "fixed"))
        io.mode = PL_IMAGE_FIXED;
    else if (!strcmp(mode, "native"))
        io.mode = PL_IMAGE_NATIVE;
    else {
        Py_DECREF(path_obj);
        PyErr_Format(PyExc_ValueError, "mode must be 'fixed' or 'native', not '%s'", mode);
        return NULL;
    }
    io.token_id = token_id;
    io.size = size;
    io.patch_size = patch;
    io.merge_size = merge;
    io.min_pixels = minp;
    io.max_pixels = maxp;
    io.limit_pixels = limit;
    io.caption_token_offset = offset;
    snprintf(io.caption_key, sizeof io.caption_key, "%s", caption);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_WEBDATASET;
    o.path = PyBytes_AS_STRING(path_obj);
    o.name = name;
    o.eos_id = eos_id;
    o.write_index = index;
    o.image = &io;
    PyObject *r = source_open_wrap(&o);
    Py_DECREF(path_obj);
    return r;
}

static void source_dealloc(PyPlSource *o) {
    /* A raw text source joins its tokenizer threads, which may wait for the
       GIL (tokenizer.c): free it with the GIL released. */
    pl_source *src = o->src;
    Py_BEGIN_ALLOW_THREADS
    pl_source_free(src);
    Py_END_ALLOW_THREADS
    PyObject_Free(o);
}

static PyObject *source_document_length(PyPlSource *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    int64_t len = 0;
    char err[PL_ERRMSG_MAX];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_document_length(o->src, i, &len);
    if (rc != PL_OK) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) return pypl_raise(rc, err);
    return PyLong_FromLongLong((long long)len);
}

static PyObject *source_read(PyPlSource *o, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"index", "offset", "count", "dtype", NULL};
    long long index, offset = 0;
    PyObject *count_obj = Py_None, *dtype_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|LOO:read", kwlist, &index, &offset,
                                     &count_obj, &dtype_obj))
        return NULL;
    pl_dtype dt = PL_DTYPE_INT64;
    if (dtype_obj != Py_None && pypl_parse_dtype(dtype_obj, &dt)) return NULL;
    if (dt != PL_DTYPE_INT64 && dt != PL_DTYPE_INT32) {
        PyErr_SetString(PyExc_ValueError, "read: dtype must be int64 or int32");
        return NULL;
    }
    char err[PL_ERRMSG_MAX];
    err[0] = '\0';
    int64_t count, len = 0;
    int rc = PL_OK;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_document_length(o->src, index, &len);
    if (rc != PL_OK) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) return pypl_raise(rc, err);
    if (count_obj == Py_None) {
        count = len - offset;
    } else {
        count = PyLong_AsLongLong(count_obj);
        if (count == -1 && PyErr_Occurred()) return NULL;
    }
    /* Check the range against the document before allocating. */
    if (count < 0 || offset < 0 || offset > len || count > len - offset) {
        char msg[128];
        snprintf(msg, sizeof msg, "read: offset %lld, count %lld out of range",
                 offset, (long long)count);
        return pypl_raise(PL_ERANGE, msg);
    }
    size_t es = pl_dtype_size(dt);
    void *buf = malloc(count ? (size_t)count * es : 1);
    if (!buf) return PyErr_NoMemory();
    /* pl_source_read: plain ids (an instruction source's prompt tokens too). */
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_read(o->src, index, offset, count, buf, dt);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        free(buf);
        return pypl_raise(rc, pl_last_errmsg());
    }
    Py_ssize_t shape[1] = {(Py_ssize_t)count};
    return pypl_array_owned(buf, pypl_format_of(dt), (Py_ssize_t)es, 1, shape);
}

/* read_many(reads) with reads an int64 buffer [n, 4] of (source, index,
 * offset, count): every range back to back, as one int64 Array. */
int pypl_parse_reads(PyObject *arg, const char *what, pl_read **out, int64_t *n_out,
                     int64_t *total_out) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (v.itemsize != 8 || !v.format || !*v.format ||
        !strchr("qlQL", v.format[strlen(v.format) - 1]) || v.len % 32 != 0) {
        PyBuffer_Release(&v);
        PyErr_Format(PyExc_TypeError, "%s: reads must be an int64 buffer of shape [n, 4]",
                     what);
        return -1;
    }
    int64_t n = (int64_t)(v.len / 32), total = 0;
    const int64_t *r = v.buf;
    pl_read *reads = PyMem_Calloc((size_t)(n ? n : 1), sizeof *reads);
    if (!reads) {
        PyBuffer_Release(&v);
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        reads[i].source = (int32_t)r[i * 4];
        reads[i].index = r[i * 4 + 1];
        reads[i].offset = r[i * 4 + 2];
        reads[i].count = r[i * 4 + 3];
        if (reads[i].count < 0 || total < 0 || reads[i].count > (INT64_MAX / 8) - total)
            total = -1; /* negative, or more tokens than memory can hold */
        else
            total += reads[i].count;
    }
    PyBuffer_Release(&v);
    *out = reads;
    *n_out = n;
    *total_out = total;
    return 0;
}

/* read_many(reads) with reads an int64 buffer [n, 4] of (source, index,
 * offset, count): every range back to back, as one int64 Array. */
static PyObject *source_read_many(PyPlSource *o, PyObject *arg) {
    pl_read *reads;
    int64_t n, total;
    if (pypl_parse_reads(arg, "read_many", &reads, &n, &total) < 0) return NULL;
    if (total < 0) {
        PyMem_Free(reads);
        return pypl_raise(PL_ERANGE, "read_many: a count is negative or the total too large");
    }
    int64_t *out = malloc((size_t)(total ? total : 1) * sizeof(int64_t));
    if (!out) {
        PyMem_Free(reads);
        return PyErr_NoMemory();
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_read_many(o->src, reads, n, out);
    Py_END_ALLOW_THREADS
    PyMem_Free(reads);
    if (rc != PL_OK) {
        free(out);
        return pypl_raise(rc, pl_last_errmsg());
    }
    Py_ssize_t shape[1] = {(Py_ssize_t)total};
    return pypl_array_owned(out, "q", 8, 1, shape);
}

/* read_raw(reads) -> bytes: the ranges at the source's stored width. */
static PyObject *source_read_raw(PyPlSource *o, PyObject *arg) {
    pl_read *reads;
    int64_t n, total;
    if (pypl_parse_reads(arg, "read_raw", &reads, &n, &total) < 0) return NULL;
    if (total < 0) {
        PyMem_Free(reads);
        return pypl_raise(PL_ERANGE, "read_raw: a count is negative or the total too large");
    }
    size_t es = pl_dtype_size(pl_source_token_dtype(o->src));
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((size_t)total * es));
    if (!b) {
        PyMem_Free(reads);
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(b);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_read_raw(o->src, reads, n, buf, (size_t)total * es);
    Py_END_ALLOW_THREADS
    PyMem_Free(reads);
    if (rc != PL_OK) {
        Py_DECREF(b);
        return pypl_raise(rc, pl_last_errmsg());
    }
    return b;
}

/* The optional source_ns argument of read_rows_reply: a writable,
 * C-contiguous int64 buffer of at least ns entries (an int64 numpy array),
 * to which the call adds nanoseconds per source.  0 and *out NULL
 * when obj is NULL or None; -1 with an exception when it is not such a
 * buffer.  The view is released by the caller (PyBuffer_Release). */
static int pypl_source_ns(PyObject *obj, Py_ssize_t ns, Py_buffer *view, int64_t **out) {
    *out = NULL;
    if (!obj || obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->itemsize != 8 || !(f[0] == 'q' || f[0] == 'l') || f[1] ||
        view->len < (Py_ssize_t)(ns * 8)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError,
                     "source_ns must be a writable int64 buffer of at least %zd entries "
                     "(one per source)", ns);
        return -1;
    }
    *out = view->buf;
    return 0;
}

/* read_rows_raw(sources, reads) -> (bytes, offsets): rows of several sources
 * (sources[reads[i, 0]] a Source) at their stored widths, back to back in
 * row order; offsets[i] is the byte offset of row i.  One call for what a
 * source loader actor answers. */
PyObject *pypl_read_rows_raw(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *srcs_obj, *reads_obj;
    if (!PyArg_ParseTuple(args, "OO:read_rows_raw", &srcs_obj, &reads_obj)) return NULL;
    PyObject *srcs = PySequence_Fast(srcs_obj, "sources must be a sequence");
    if (!srcs) return NULL;
    pl_read *reads = NULL;
    int64_t n = 0, total = 0;
    if (pypl_parse_reads(reads_obj, "read_rows_raw", &reads, &n, &total) < 0) {
        Py_DECREF(srcs);
        return NULL;
    }
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(srcs);
    pl_source **h = PyMem_Calloc((size_t)(ns ? ns : 1), sizeof *h);
    int64_t *offs = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    PyObject *ret = NULL, *b = NULL;
    if (!h || !offs) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(srcs, i);
        if (it != Py_None && !PyObject_TypeCheck(it, &PyPl_SourceType)) {
            PyErr_SetString(PyExc_TypeError, "read_rows_raw: sources must be Source or None");
            goto out;
        }
        h[i] = it == Py_None ? NULL : ((PyPlSource *)it)->src;
    }
    size_t bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t s = reads[i].source;
        if (s < 0 || s >= ns || !h[s] || reads[i].count < 0) {
            PyErr_Format(PyExc_ValueError, "read_rows_raw: row %lld names source %d, not hosted here",
                         (long long)i, (int)s);
            goto out;
        }
        offs[i] = (int64_t)bytes;
        bytes += (size_t)reads[i].count * pl_dtype_size(pl_source_token_dtype(h[s]));
    }
    b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (!b) goto out;
    char *buf = PyBytes_AS_STRING(b);
    int rc = PL_OK;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        pl_source *src = h[reads[i].source];
        size_t es = pl_dtype_size(pl_source_token_dtype(src));
        rc = pl_source_read_raw(src, &reads[i], 1, buf + offs[i], (size_t)reads[i].count * es);
    }
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        pypl_raise(rc, pl_last_errmsg());
        goto out;
    }
    Py_ssize_t shape[1] = {(Py_ssize_t)n};
    PyObject *arr = pypl_array_owned(offs, "q", 8, 1, shape);
    offs = NULL;
    if (!arr) goto out;
    ret = PyTuple_Pack(2, b, arr);
    Py_DECREF(arr);
out:
    Py_XDECREF(b);
    free(offs);
    PyMem_Free(h);
    PyMem_Free(reads);
    Py_DECREF(srcs);
    return ret;
}

/* read_rows_reply(sources, reads[, source_ns]) -> bytes: pl_reply_encode's
 * reply (tokens at stored width and the images of the rows, decoded and
 * resized here).  What a source-loader actor answers when some source has
 * images.  source_ns: see pypl_source_ns (pl_reply_encode_timed). */
PyObject *pypl_read_rows_reply(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *srcs_obj, *reads_obj, *ns_obj = NULL;
    if (!PyArg_ParseTuple(args, "OO|O:read_rows_reply", &srcs_obj, &reads_obj, &ns_obj))
        return NULL;
    PyObject *srcs = PySequence_Fast(srcs_obj, "sources must be a sequence");
    if (!srcs) return NULL;
    pl_read *reads = NULL;
    int64_t n = 0, total = 0;
    if (pypl_parse_reads(reads_obj, "read_rows_reply", &reads, &n, &total) < 0) {
        Py_DECREF(srcs);
        return NULL;
    }
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(srcs);
    pl_source **h = PyMem_Calloc((size_t)(ns ? ns : 1), sizeof *h);
    PyObject *b = NULL;
    Py_buffer nsv;
    int64_t *src_ns = NULL;
    if (!h) {
        PyErr_NoMemory();
        goto out;
    }
    if (pypl_source_ns(ns_obj, ns, &nsv, &src_ns) < 0) goto out;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(srcs, i);
        if (it != Py_None && !PyObject_TypeCheck(it, &PyPl_SourceType)) {
            PyErr_SetString(PyExc_TypeError, "read_rows_reply: sources must be Source or None");
            goto out;
        }
        h[i] = it == Py_None ? NULL : ((PyPlSource *)it)->src;
    }
    int rc;
    size_t len = 0;
    char err[PL_ERRMSG_MAX];
    Py_BEGIN_ALLOW_THREADS
    rc = pl_reply_encode(h, (int64_t)ns, reads, n, NULL, 0, &len);
    if (rc) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc) {
        pypl_raise(rc, err);
        goto out;
    }
    b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!b) goto out;
    char *buf = PyBytes_AS_STRING(b);
    Py_BEGIN_ALLOW_THREADS
    rc = pl_reply_encode_timed(h, (int64_t)ns, reads, n, buf, len, &len, src_ns);
    if (rc) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc) {
        Py_CLEAR(b);
        pypl_raise(rc, err);
    }
out:
    if (src_ns) PyBuffer_Release(&nsv);
    PyMem_Free(h);
    PyMem_Free(reads);
    Py_DECREF(srcs);
    return b;
}

static PyObject *source_release_pages(PyPlSource *o, PyObject *unused) {
    (void)unused;
    int rc;
    char err[PL_ERRMSG_MAX];
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_release_pages(o->src);
    if (rc != PL_OK) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) return pypl_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *source_release_tokenizer(PyPlSource *o, PyObject *unused) {
    (void)unused;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_release_tokenizer(o->src);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK)
        return pypl_raise(rc, "release_tokenizer: this source's tokenizer was not made "
                              "through a config and cannot be loaded again");
    Py_RETURN_NONE;
}

static PyObject *source_tokenizer_state(PyPlSource *o, PyObject *unused) {
    (void)unused;
    int64_t loads = 0, shared = 0;
    int st = pl_source_tokenizer_state(o->src, &loads, &shared);
    if (st < 0) Py_RETURN_NONE;
    return Py_BuildValue("{s:O,s:L,s:L}", "loaded", st ? Py_True : Py_False, "loads",
                         (long long)loads, "shared_by", (long long)shared);
}

static PyObject *source_stats(PyPlSource *o, PyObject *unused) {
    (void)unused;
    pl_source_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    int rc;
    char err[PL_ERRMSG_MAX];
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_get_stats(o->src, &st);
    if (rc != PL_OK) snprintf(err, sizeof err, "%s", pl_last_errmsg());
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) return pypl_raise(rc, err);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "files", (long long)st.files,
                         "documents", (long long)st.documents, "tokens",
                         (long long)st.tokens, "length_p50", (long long)st.length_p50,
                         "length_p90", (long long)st.length_p90, "length_p99",
                         (long long)st.length_p99, "length_max",
                         (long long)st.length_max);
}

static PyObject *image_info_dict(const pl_image_info *in) {
    return Py_BuildValue(
        "{s:L,s:L,s:L,s:L,s:(LLL),s:L,s:L,s:L,s:n,s:s}", "width", (long long)in->width,
        "height", (long long)in->height, "out_width", (long long)in->out_width,
        "out_height", (long long)in->out_height, "grid_thw", (long long)in->grid_t,
        (long long)in->grid_h, (long long)in->grid_w, "patches", (long long)in->patches,
        "tokens", (long long)in->tokens, "patch_dim", (long long)in->patch_dim, "bytes",
        (Py_ssize_t)in->bytes, "mode", in->mode == PL_IMAGE_NATIVE ? "native" : "fixed");
}

static PyObject *source_image_info(PyPlSource *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    pl_image_info in;
    int rc = pl_source_image_info(o->src, (int64_t)i, &in);
    if (rc != PL_OK) return pypl_raise(rc, pl_last_errmsg());
    return image_info_dict(&in);
}

static PyObject *source_read_image(PyPlSource *o, PyObject *arg) {
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    pl_image_info in;
    int rc = pl_source_image_info(o->src, (int64_t)i, &in);
    if (rc != PL_OK) return pypl_raise(rc, pl_last_errmsg());
    uint8_t *buf = malloc(in.bytes ? in.bytes : 1);
    if (!buf) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_read_image(o->src, (int64_t)i, buf, in.bytes, &in);
    Py_END_ALLOW_THREADS
    if (rc != PL_OK) {
        free(buf);
        return pypl_raise(rc, pl_last_errmsg());
    }
    Py_ssize_t shape[3];
    if (in.mode == PL_IMAGE_NATIVE) {
        shape[0] = (Py_ssize_t)in.patches;
        shape[1] = (Py_ssize_t)in.patch_dim;
        return pypl_array_owned(buf, "B", 1, 2, shape);
    }
    shape[0] = 3;
    shape[1] = (Py_ssize_t)in.out_height;
    shape[2] = (Py_ssize_t)in.out_width;
    return pypl_array_owned(buf, "B", 1, 3, shape);
}

static PyObject *source_get_num_skipped(PyPlSource *o, void *c) {
    (void)c;
    return PyLong_FromLongLong((long long)pl_source_num_skipped(o->src));
}

static PyObject *source_get_num_documents(PyPlSource *o, void *c) {
    (void)c;
    return PyLong_FromLongLong((long long)pl_source_num_documents(o->src));
}

static Py_ssize_t source_len(PyPlSource *o) {
    return (Py_ssize_t)pl_source_num_documents(o->src);
}

static PyObject *source_get_num_files(PyPlSource *o, void *c) {
    (void)c;
    return PyLong_FromLongLong((long long)pl_source_num_files(o->src));
}

static PyObject *source_get_name(PyPlSource *o, void *c) {
    (void)c;
    return PyUnicode_FromString(pl_source_name(o->src));
}

static PyObject *source_get_type(PyPlSource *o, void *c) {
    (void)c;
    const char *name = pl_source_type_name(pl_source_get_type(o->src));
    return PyUnicode_FromString(name ? name : "unknown");
}

static PyObject *source_lengths(PyPlSource *o, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "lengths: indices must be a sequence of int");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *idx = PyMem_Calloc((size_t)(n ? n : 1), sizeof *idx);
    int64_t *len = PyMem_Calloc((size_t)(n ? n : 1), sizeof *len);
    if (!idx || !len) {
        Py_DECREF(seq);
        PyMem_Free(idx);
        PyMem_Free(len);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        idx[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (idx[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            PyMem_Free(idx);
            PyMem_Free(len);
            return NULL;
        }
    }
    Py_DECREF(seq);
    int rc;
    pl_source *src = o->src;
    Py_BEGIN_ALLOW_THREADS
    rc = pl_source_lengths(src, idx, (int64_t)n, len);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (rc != PL_OK) {
        pypl_raise(rc, pl_last_errmsg());
    } else if ((out = PyList_New(n)) != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromLongLong((long long)len[i]);
            if (!v) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, v);
        }
    }
    PyMem_Free(idx);
    PyMem_Free(len);
    return out;
}

static PyObject *source_get_num_tokenized(PyPlSource *o, void *c) {
    (void)c;
    return PyLong_FromLongLong((long long)pl_source_num_tokenized(o->src));
}

static PyObject *source_get_tokenize_cpu_s(PyPlSource *o, void *c) {
    (void)c;
    return PyFloat_FromDouble((double)pl_source_tokenize_cpu_ns(o->src) * 1e-9);
}

static PyObject *source_get_token_dtype(PyPlSource *o, void *c) {
    (void)c;
    return PyUnicode_FromString(pl_dtype_name(pl_source_token_dtype(o->src)));
}

static PyObject *source_get_sizeof(PyPlSource *o, void *c) {
    (void)c;
    return PyLong_FromSize_t(pl_source_sizeof(o->src));
}

static PyObject *source_get_errmsg(PyPlSource *o, void *c) {
    (void)c;
    return PyUnicode_FromString(pl_source_errmsg(o->src));
}

static PyMethodDef source_methods[] = {
    {"lengths", (PyCFunction)source_lengths, METH_O,
     "lengths(indices) -> list of int\n\nLengths of many documents (pl_source_lengths): "
     "a raw text source tokenizes\nthem in batches and keeps the tokens for the reads. "
     "A bad document's entry is\nits negative PL_E* code (document_length(i) raises "
     "with its message)."},
    {"open", (PyCFunction)(void (*)(void))source_open,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Source.open(type, path, name=None, token_dtype=None, eos_id=-1, write_index=0)"
     " -> Source\n\n"
     "Open a source: type 'megatron' (path = prefix, directory or glob of prefixes),\n"
     "'llmc' or 'flat' (token_dtype 'uint16' or 'uint32'; eos_id -1 = type default).\n"
     "type is a name or code of source_types(); raw text sources need a tokenizer and\n"
     "webdataset sources image options: open those with Config.open_source or\n"
     "open_webdataset.  ValueError for an unknown type name.\n"
     "write_index: the .plidx sidecar policy of llmc/flat sources, INDEX_WRITE (0: one\n"
     "writer under a lock), INDEX_READ (2: map one, write none), INDEX_MEMORY (-1).\n"
     "Raises PolyloadIOError (ENOENT, EIO) or FormatError naming file, field, offset."},
    {"open_webdataset", (PyCFunction)(void (*)(void))source_open_webdataset,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Source.open_webdataset(path, token_id, *, mode='fixed', size=0, patch_size=0,\n"
     "    merge_size=0, min_pixels=0, max_pixels=0, limit_pixels=0, caption='',\n"
     "    caption_token_offset=0, eos_id=-1, index=0, name=None) -> Source\n\n"
     "Open WebDataset shards (path: file, directory, glob or brace pattern) as an\n"
     "image-text source (pl_image_options; 0 takes the default).  index 0 writes a\n"
     "<shard>.plwds sidecar, -1 keeps the index in memory.  Raises PolyloadIOError or\n"
     "FormatError naming shard, member and byte offset."},
    {"document_length", (PyCFunction)source_document_length, METH_O,
     "document_length(i) -> int\n\nLength of document i in tokens.  RangeError for a bad "
     "index, FormatError (EBOUNDS) when it lies outside its data file."},
    {"read", (PyCFunction)(void (*)(void))source_read, METH_VARARGS | METH_KEYWORDS,
     "read(index, offset=0, count=None, dtype='int64') -> Array\n\n"
     "Tokens [offset, offset+count) of document `index` (count None: to its end) as a\n"
     "new 1-D Array of int64 or int32.  Float token files are truncated toward zero.\n"
     "Raises RangeError or FormatError."},
    {"read_raw", (PyCFunction)source_read_raw, METH_O,
     "read_raw(reads) -> bytes\n\nThe token ranges of `reads` (int64 [n, 4]) back to "
     "back at the source's\nstored width (token_dtype), read with pread "
     "(pl_source_read_raw)."},
    {"read_many", (PyCFunction)source_read_many, METH_O,
     "read_many(reads) -> Array\n\nThe token ranges of `reads` (int64 [n, 4]: source "
     "(ignored), index, offset,\ncount; e.g. Plan.reads) back to back as one int64 "
     "Array.  RangeError, FormatError."},
    {"release_pages", (PyCFunction)source_release_pages, METH_NOARGS,
     "release_pages() -> None\n\nGive back this process's resident pages of the source's "
     "read-only file\nmappings (index and data files) with madvise(MADV_DONTNEED); later "
     "reads fault\nthem back in with the same bytes.  In-memory indexes and heap memory "
     "stay\n(pl_source_release_pages).  PolyloadIOError when madvise fails."},
    {"release_tokenizer", (PyCFunction)source_release_tokenizer, METH_NOARGS,
     "release_tokenizer() -> None\n\nUnload a raw text source's tokenizer until it is "
     "needed again (a standby\nreplica): the next tokenization loads it from the same "
     "file (checked unchanged);\nfree heap pages go back to the system "
     "(pl_source_release_tokenizer).\nNo-op for sources without a tokenizer.  "
     "InvalidArgumentError for a tokenizer\nnot made through a config."},
    {"tokenizer_state", (PyCFunction)source_tokenizer_state, METH_NOARGS,
     "tokenizer_state() -> dict | None\n\n{'loaded': bool, 'loads': loads so far (1 at "
     "open, +1 per load after a\nrelease), 'shared_by': sources of this process using "
     "the same loaded\ntokenizer (0 when released)}; None without a config-made "
     "tokenizer\n(pl_source_tokenizer_state)."},
    {"stats", (PyCFunction)source_stats, METH_NOARGS,
     "stats() -> dict\n\n{'files', 'documents', 'tokens', 'length_p50', 'length_p90', "
     "'length_p99', 'length_max'}; scans the index."},
    {"image_info", (PyCFunction)source_image_info, METH_O,
     "image_info(i) -> dict\n\nImage of sample i of a webdataset source from the index "
     "(no decode):\n{'width', 'height' (stored), 'out_width', 'out_height', 'grid_thw', "
     "'patches',\n'tokens' (visual tokens), 'patch_dim', 'bytes', 'mode'} "
     "(pl_source_image_info)."},
    {"read_image", (PyCFunction)source_read_image, METH_O,
     "read_image(i) -> Array uint8\n\nDecoded and resized image of sample i: fixed mode "
     "[3, H, W]; native\nmode [patches, 3*p*p] in Qwen2-VL's patch order "
     "(pl_source_read_image).\nRaises FormatError (EIMAGE) naming shard, member and "
     "offset."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef source_getset[] = {
    {"num_skipped", (getter)source_get_num_skipped, NULL,
     "int: bad records left out at open (on_error: skip)", NULL},
    {"num_documents", (getter)source_get_num_documents, NULL, "int: documents", NULL},
    {"num_files", (getter)source_get_num_files, NULL, "int: files", NULL},
    {"num_tokenized", (getter)source_get_num_tokenized, NULL,
     "int: documents tokenized so far (raw text sources; pl_source_num_tokenized)",
     NULL},
    {"tokenize_cpu_s", (getter)source_get_tokenize_cpu_s, NULL,
     "float: CPU seconds the threads tokenizing this source's documents spent on "
     "them so far (reading, parsing, encode_batch; raw text sources, else 0.0; "
     "pl_source_tokenize_cpu_ns)",
     NULL},
    {"name", (getter)source_get_name, NULL, "str: the name used in messages", NULL},
    {"type", (getter)source_get_type, NULL, "str: the type's name in source_types() ('megatron', 'jsonl', ...)", NULL},
    {"token_dtype", (getter)source_get_token_dtype, NULL,
     "str: numpy name of the stored token type", NULL},
    {"sizeof", (getter)source_get_sizeof, NULL,
     "int: heap bytes held, excluding mapped file pages", NULL},
    {"errmsg", (getter)source_get_errmsg, NULL, "str: the last error message", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods source_as_sequence = {
    .sq_length = (lenfunc)source_len,
};

PyTypeObject PyPl_SourceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Source",
    .tp_basicsize = sizeof(PyPlSource),
    .tp_dealloc = (destructor)source_dealloc,
    .tp_as_sequence = &source_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One data source (pl_source).  Create with Source.open or Config.open_source.\n"
              "Reads are thread-safe and run without the GIL.",
    .tp_methods = source_methods,
    .tp_getset = source_getset,
};
