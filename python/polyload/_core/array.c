/*
 * array.c -- Array, a buffer-protocol view of C memory (a retained batch's
 * field, or memory the Array owns).
 *
 * An Array over a batch field holds its own pl_batch_retain reference, so the
 * batch's buffer goes back to the loader's pool only when the last Array (and
 * so the last NumPy array or tensor that wraps it) is gone, whatever happens to
 * the Batch, the Loader or the rank's next batch.  numpy.asarray(array) and
 * torch.from_numpy(numpy.asarray(array)) see the C memory itself.  The memory
 * is writable so that torch does not warn, but it may be shared by the batches
 * of several ranks of one DP group served by the same loader: do not modify
 * it in place.
 *
 * After os.fork a child never releases references taken by its parent: the
 * pool's lock may be held by a parent thread that does not exist in the
 * child.  The child leaks those references instead (its memory is a copy).
 */
#include "core.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    pl_batch *batch; /* retained, or NULL */
    void *owned;     /* malloc'd, or NULL */
    void *data;
    char format[4];
    Py_ssize_t itemsize;
    int ndim;
    Py_ssize_t shape[4]; /* ndim 1 to 4 (images: [n, 3, H, W]) */
    Py_ssize_t strides[4];
    int readonly;
    pid_t pid;
} PyPlArray;

/* A non-NULL address for empty arrays (buffers must not be NULL). */
int64_t pypl_empty[1];

const char *pypl_format_of(pl_dtype dtype) {
    switch (dtype) {
    case PL_DTYPE_INT64: return "q";
    case PL_DTYPE_INT32: return "i";
    case PL_DTYPE_FLOAT32: return "f";
    case PL_DTYPE_FLOAT64: return "d";
    default: return "B";
    }
}

static const char *pypl_numpy_name(const char *format) {
    switch (format[0]) {
    case 'q': return "int64";
    case 'i': return "int32";
    case 'f': return "float32";
    case 'd': return "float64";
    default: return "uint8";
    }
}

static PyObject *pypl_array_new(void *data, const char *format,
                                Py_ssize_t itemsize, int ndim,
                                const Py_ssize_t *shape) {
    PyPlArray *a = PyObject_New(PyPlArray, &PyPl_ArrayType);
    if (!a) return NULL;
    a->batch = NULL;
    a->owned = NULL;
    a->data = data ? data : (void *)pypl_empty;
    snprintf(a->format, sizeof a->format, "%s", format);
    a->itemsize = itemsize;
    a->ndim = ndim;
    if (ndim < 1 || ndim > 4) ndim = 1; /* callers pass 1..4 */
    a->ndim = ndim;
    for (int i = 0; i < 4; i++) a->shape[i] = i < ndim ? shape[i] : 1;
    a->strides[ndim - 1] = itemsize;
    for (int i = ndim - 2; i >= 0; i--) a->strides[i] = a->strides[i + 1] * a->shape[i + 1];
    a->readonly = 0;
    a->pid = pypl_getpid();
    return (PyObject *)a;
}

PyObject *pypl_array_from_batch(pl_batch *batch, void *data, const char *format,
                                Py_ssize_t itemsize, int ndim,
                                const Py_ssize_t *shape, int writable) {
    PyPlArray *a = (PyPlArray *)pypl_array_new(data, format, itemsize, ndim, shape);
    if (!a) return NULL;
    pl_batch_retain(batch);
    a->batch = batch;
    a->readonly = !writable;
    return (PyObject *)a;
}

PyObject *pypl_array_owned(void *data, const char *format, Py_ssize_t itemsize,
                           int ndim, const Py_ssize_t *shape) {
    PyPlArray *a = (PyPlArray *)pypl_array_new(data, format, itemsize, ndim, shape);
    if (!a) {
        free(data);
        return NULL;
    }
    a->owned = data;
    return (PyObject *)a;
}

static void array_dealloc(PyPlArray *a) {
    if (a->batch && a->pid == pypl_getpid()) pl_batch_release(a->batch);
    free(a->owned);
    PyObject_Free(a);
}

static Py_ssize_t array_nitems(const PyPlArray *a) {
    return a->shape[0] * a->shape[1] * a->shape[2] * a->shape[3];
}

static int array_getbuffer(PyPlArray *a, Py_buffer *view, int flags) {
    /* Always C-contiguous: every request is met but a writable one of
     * read-only (batch) memory. */
    if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && a->readonly) {
        view->obj = NULL;
        PyErr_SetString(PyExc_BufferError,
                        "polyload batch memory is read-only: it is shared by the ranks "
                        "of a DP group (copy it to modify it)");
        return -1;
    }
    view->obj = Py_NewRef((PyObject *)a);
    view->buf = a->data;
    view->len = array_nitems(a) * a->itemsize;
    view->readonly = a->readonly;
    view->itemsize = a->itemsize;
    view->format = (flags & PyBUF_FORMAT) ? a->format : NULL;
    view->ndim = a->ndim;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? a->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? a->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs array_as_buffer = {
    (getbufferproc)array_getbuffer,
    NULL,
};

static Py_ssize_t array_len(PyPlArray *a) { return a->shape[0]; }

static PySequenceMethods array_as_sequence = {
    .sq_length = (lenfunc)array_len,
};

static PyObject *array_get_shape(PyPlArray *a, void *c) {
    (void)c;
    PyObject *t = PyTuple_New(a->ndim);
    for (int i = 0; t && i < a->ndim; i++) {
        PyObject *v = PyLong_FromSsize_t(a->shape[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *array_get_dtype(PyPlArray *a, void *c) {
    (void)c;
    return PyUnicode_FromString(pypl_numpy_name(a->format));
}

static PyObject *array_get_address(PyPlArray *a, void *c) {
    (void)c;
    return PyLong_FromVoidPtr(a->data);
}

static PyObject *array_get_nbytes(PyPlArray *a, void *c) {
    (void)c;
    return PyLong_FromSsize_t(array_nitems(a) * a->itemsize);
}

static PyObject *array_get_readonly(PyPlArray *a, void *c) {
    (void)c;
    return PyBool_FromLong(a->readonly);
}

static PyObject *array_get_ndim(PyPlArray *a, void *c) {
    (void)c;
    return PyLong_FromLong(a->ndim);
}

static PyObject *array_tolist(PyPlArray *a, PyObject *unused) {
    (void)unused;
    PyObject *mv = PyMemoryView_FromObject((PyObject *)a);
    if (!mv) return NULL;
    PyObject *r = PyObject_CallMethod(mv, "tolist", NULL);
    Py_DECREF(mv);
    return r;
}

static PyObject *array_repr(PyPlArray *a) {
    if (a->ndim == 1)
        return PyUnicode_FromFormat("<polyload._core.Array %s[%zd] at %p>",
                                    pypl_numpy_name(a->format), a->shape[0], a->data);
    return PyUnicode_FromFormat("<polyload._core.Array %s[%zd, %zd] at %p>",
                                pypl_numpy_name(a->format), a->shape[0], a->shape[1],
                                a->data);
}

static PyGetSetDef array_getset[] = {
    {"shape", (getter)array_get_shape, NULL, "tuple of int: the array's shape", NULL},
    {"ndim", (getter)array_get_ndim, NULL, "int: 1 to 4", NULL},
    {"dtype", (getter)array_get_dtype, NULL,
     "str: numpy name of the element type ('int64', 'int32', 'float32', 'float64')", NULL},
    {"address", (getter)array_get_address, NULL,
     "int: address of the first element (the C memory; equals "
     "numpy.asarray(a).ctypes.data)", NULL},
    {"nbytes", (getter)array_get_nbytes, NULL, "int: size in bytes", NULL},
    {"readonly", (getter)array_get_readonly, NULL,
     "bool: the buffer is exported read-only (batch memory shared by a DP group)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef array_methods[] = {
    {"tolist", (PyCFunction)array_tolist, METH_NOARGS, "The elements as (nested) lists."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PyPl_ArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Array",
    .tp_basicsize = sizeof(PyPlArray),
    .tp_dealloc = (destructor)array_dealloc,
    .tp_repr = (reprfunc)array_repr,
    .tp_as_sequence = &array_as_sequence,
    .tp_as_buffer = &array_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A C-contiguous array in C memory, exposed through the buffer protocol.\n\n"
              "numpy.asarray(a) wraps it without a copy.  An Array over a batch field\n"
              "keeps the batch's buffer out of the loader's pool for as long as it (or\n"
              "any array wrapping it) lives, and is read-only (`readonly`): the memory is\n"
              "shared by the ranks of a DP group, so a NumPy array over it is not\n"
              "writeable and a writable buffer request raises BufferError.",
    .tp_methods = array_methods,
    .tp_getset = array_getset,
};
