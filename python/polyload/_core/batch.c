/*
 * batch.c -- Batch, one retained micro-batch (pl_batch_retain), and its
 * fields as Arrays or tensors (to_dict, DLPack).
 */
#include "core.h"

#include <string.h>

/* ------------------------------------------------------------- Batch */

typedef struct {
    PyObject_HEAD
    pl_batch *b; /* one retained reference, or NULL after release() */
    pid_t pid;
} PyPlBatch;

PyObject *pypl_batch_new(pl_batch *batch) {
    PyPlBatch *o = PyObject_New(PyPlBatch, &PyPl_BatchType);
    if (!o) {
        pl_batch_release(batch);
        return NULL;
    }
    o->b = batch;
    o->pid = pypl_getpid();
    return (PyObject *)o;
}

static void batch_drop(PyPlBatch *o) {
    pl_batch *b = o->b;
    o->b = NULL;
    if (b && o->pid == pypl_getpid()) pl_batch_release(b);
}

static void batch_dealloc(PyPlBatch *o) {
    batch_drop(o);
    PyObject_Free(o);
}

static pl_batch *batch_get(PyPlBatch *o) {
    if (!o->b) PyErr_SetString(PyExc_ValueError, "batch was released");
    return o->b;
}

#define BATCH_INT_GETTER(field)                                                 \
    static PyObject *batch_get_##field(PyPlBatch *o, void *c) {                 \
        (void)c;                                                                \
        pl_batch *b = batch_get(o);                                             \
        return b ? PyLong_FromLongLong((long long)b->field) : NULL;             \
    }
BATCH_INT_GETTER(step)
BATCH_INT_GETTER(micro_batch)
BATCH_INT_GETTER(dp_rank)
BATCH_INT_GETTER(rows)
BATCH_INT_GETTER(cols)
BATCH_INT_GETTER(fields)
BATCH_INT_GETTER(n_cu_seqlens)
BATCH_INT_GETTER(tokens)
BATCH_INT_GETTER(n_chunks)
BATCH_INT_GETTER(n_images)
BATCH_INT_GETTER(visual_tokens)
BATCH_INT_GETTER(step_loss_tokens)
BATCH_INT_GETTER(rank_loss_tokens)
BATCH_INT_GETTER(image_mode)

static PyObject *batch_get_max_seqlen(PyPlBatch *o, void *c) {
    (void)c;
    pl_batch *b = batch_get(o);
    if (!b) return NULL;
    if (!(b->fields & PL_FIELD_MAX_SEQLEN)) Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)b->max_seqlen);
}

static PyObject *batch_get_dtype(PyPlBatch *o, void *c) {
    (void)c;
    pl_batch *b = batch_get(o);
    return b ? PyUnicode_FromString(pl_dtype_name(b->dtype)) : NULL;
}

/* closure: which field */
enum { F_INPUT_IDS, F_LABELS, F_LOSS_MASK, F_POSITION_IDS, F_CU_SEQLENS, F_SEGMENT_SOURCES,
       F_PIXEL_VALUES, F_IMAGE_GRID_THW, F_IMAGE_POSITIONS };

/* Where field `f` of b lies: 1 and its address, element format, size, rank
 * and shape; 0 when absent. */
static int batch_field_desc(const pl_batch *b, int f, void **data, const char **fmt,
                            Py_ssize_t *itemsize, int *ndim, Py_ssize_t shape[4]) {
    shape[0] = (Py_ssize_t)b->rows;
    shape[1] = (Py_ssize_t)b->cols;
    *ndim = 2;
    switch (f) {
    case F_INPUT_IDS:
    case F_LABELS:
        *data = f == F_INPUT_IDS ? b->input_ids : b->labels;
        *fmt = pypl_format_of(b->dtype);
        *itemsize = (Py_ssize_t)pl_dtype_size(b->dtype);
        return *data != NULL;
    case F_LOSS_MASK:
        *data = b->loss_mask;
        *fmt = "f";
        *itemsize = sizeof(float);
        return *data != NULL;
    case F_POSITION_IDS:
        *data = b->position_ids;
        *fmt = "q";
        *itemsize = sizeof(int64_t);
        return *data != NULL;
    case F_CU_SEQLENS:
        *data = b->cu_seqlens;
        *fmt = "i";
        *itemsize = sizeof(int32_t);
        *ndim = 1;
        shape[0] = (Py_ssize_t)b->n_cu_seqlens;
        return *data != NULL;
    case F_SEGMENT_SOURCES:
        *data = b->segment_sources;
        *fmt = "i";
        *itemsize = sizeof(int32_t);
        *ndim = 1;
        shape[0] = (Py_ssize_t)(b->n_cu_seqlens - 1);
        return *data != NULL && b->n_cu_seqlens >= 1;
    case F_PIXEL_VALUES:
        *data = b->pixel_values;
        *fmt = "B";
        *itemsize = 1;
        if (!b->pixel_values || !b->n_images) return 0;
        if (b->image_mode == PL_IMAGE_NATIVE) {
            shape[0] = (Py_ssize_t)b->n_patches;
            shape[1] = (Py_ssize_t)b->patch_dim;
            return 1;
        }
        *ndim = 4;
        shape[0] = (Py_ssize_t)b->n_images;
        shape[1] = 3;
        shape[2] = (Py_ssize_t)b->image_height;
        shape[3] = (Py_ssize_t)b->image_width;
        return 1;
    case F_IMAGE_GRID_THW:
    case F_IMAGE_POSITIONS:
        if (!b->image_grid_thw || !b->n_images) return 0;
        *data = f == F_IMAGE_GRID_THW ? (void *)b->image_grid_thw : (void *)b->image_positions;
        *fmt = "q";
        *itemsize = sizeof(int64_t);
        shape[0] = (Py_ssize_t)b->n_images;
        shape[1] = f == F_IMAGE_GRID_THW ? 3 : 2;
        return 1;
    }
    return 0;
}

/* Field `f` of b as an Array, or Py_None (new reference) when absent. */
static PyObject *batch_field(pl_batch *b, int f, int writable) {
    void *data = NULL;
    const char *fmt = "B";
    Py_ssize_t itemsize = 1, shape[4];
    int ndim = 1;
    if (!batch_field_desc(b, f, &data, &fmt, &itemsize, &ndim, shape)) Py_RETURN_NONE;
    return pypl_array_from_batch(b, data, fmt, itemsize, ndim, shape, writable);
}

/*
 * DLPack export (https://github.com/dmlc/dlpack, include/dlpack/dlpack.h,
 * the unversioned ABI of v0.8 that torch.from_dlpack takes as a "dltensor"
 * capsule).  The managed tensor holds a pl_batch_retain reference, given
 * back by its deleter (thread-safe, as the consumer may run it from any
 * thread; not in a forked child, as for Arrays), so the memory returns to
 * the pool when the last tensor lets go.  One C call per field instead of an
 * Array, a NumPy array and torch.from_numpy.
 */
typedef struct {
    int32_t device_type; /* kDLCPU = 1 */
    int32_t device_id;
} pypl_DLDevice;
typedef struct {
    uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2 */
    uint8_t bits;
    uint16_t lanes;
} pypl_DLDataType;
typedef struct {
    void *data;
    pypl_DLDevice device;
    int32_t ndim;
    pypl_DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} pypl_DLTensor;
typedef struct pypl_DLManagedTensor {
    pypl_DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct pypl_DLManagedTensor *self);
} pypl_DLManagedTensor;

typedef struct {
    pypl_DLManagedTensor m;
    int64_t shape[4];
    pid_t pid;
} pypl_dl_export;

static void pypl_dl_deleter(pypl_DLManagedTensor *m) {
    pypl_dl_export *x = (pypl_dl_export *)m;
    if (x->pid == pypl_getpid()) pl_batch_release(m->manager_ctx);
    free(x);
}

static void pypl_dl_capsule_free(PyObject *cap) {
    /* Not consumed (the consumer renames it "used_dltensor"): ours to free. */
    if (!PyCapsule_IsValid(cap, "dltensor")) return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    pypl_DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
    PyErr_Restore(et, ev, tb);
}

/* Field `f` of b as a DLPack capsule, or Py_None (new reference). */
static PyObject *batch_field_dlpack(pl_batch *b, int f) {
    void *data = NULL;
    const char *fmt = "B";
    Py_ssize_t itemsize = 1, shape[4];
    int ndim = 1;
    if (!batch_field_desc(b, f, &data, &fmt, &itemsize, &ndim, shape)) Py_RETURN_NONE;
    pypl_dl_export *x = malloc(sizeof *x);
    if (!x) return PyErr_NoMemory();
    memset(x, 0, sizeof *x);
    x->m.dl_tensor.data = data ? data : (void *)pypl_empty;
    x->m.dl_tensor.device.device_type = 1;
    x->m.dl_tensor.ndim = ndim;
    x->m.dl_tensor.dtype.code = fmt[0] == 'f' || fmt[0] == 'd' ? 2 : fmt[0] == 'B' ? 1 : 0;
    x->m.dl_tensor.dtype.bits = (uint8_t)(8 * itemsize);
    x->m.dl_tensor.dtype.lanes = 1;
    for (int i = 0; i < ndim; i++) x->shape[i] = shape[i];
    x->m.dl_tensor.shape = x->shape;
    x->m.manager_ctx = pl_batch_retain(b);
    x->m.deleter = pypl_dl_deleter;
    x->pid = pypl_getpid();
    PyObject *cap = PyCapsule_New(&x->m, "dltensor", pypl_dl_capsule_free);
    if (!cap) pypl_dl_deleter(&x->m);
    return cap;
}

/* Field f of b as to_dict hands it out: through dlpack (a callable taking a
 * capsule) or as an Array through the convert callables; Py_None when
 * absent. */
static PyObject *batch_export(pl_batch *b, int f, int writable, PyObject *dlpack,
                              PyObject *const *conv, Py_ssize_t nconv) {
    if (dlpack) {
        PyObject *cap = batch_field_dlpack(b, f);
        if (!cap || cap == Py_None) return cap;
        PyObject *t = PyObject_CallOneArg(dlpack, cap);
        Py_DECREF(cap);
        return t;
    }
    PyObject *v = batch_field(b, f, writable);
    if (v == Py_None) return v;
    for (Py_ssize_t c = 0; v && c < nconv; c++) {
        PyObject *w = PyObject_CallOneArg(conv[c], v);
        Py_DECREF(v);
        v = w;
    }
    return v;
}

static PyObject *batch_get_array(PyPlBatch *o, void *closure) {
    pl_batch *b = batch_get(o);
    if (!b) return NULL;
    return batch_field(b, (int)(intptr_t)closure, 0);
}

static PyObject *pypl_field_names[F_CU_SEQLENS + 1];
static PyObject *pypl_max_seqlen_name;

/* The dict of b (Batch.to_dict, Loader.next_dict): each present field through
 * batch_export, plus max_seqlen; a new reference, or NULL with an exception. */
int pypl_batch_dict_check(PyObject *convert, int writable, PyObject *dlpack) {
    if (dlpack && (!writable || !PyCallable_Check(dlpack))) {
        PyErr_SetString(PyExc_ValueError,
                        "to_dict: dlpack must be a callable, and needs writable=True "
                        "(DLPack cannot mark memory read-only)");
        return -1;
    }
    if (convert && convert != Py_None && !PyTuple_Check(convert)) {
        PyErr_SetString(PyExc_TypeError, "to_dict: convert must be a tuple of callables");
        return -1;
    }
    return 0;
}

PyObject *pypl_batch_dict(pl_batch *b, PyObject *convert, int writable, PyObject *dlpack) {
    static const char *const names[] = {"input_ids", "labels", "loss_mask",
                                        "position_ids", "cu_seqlens"};
    if (pypl_batch_dict_check(convert, writable, dlpack)) return NULL;
    Py_ssize_t nconv = 0;
    PyObject *const *conv = NULL;
    if (convert && convert != Py_None) {
        nconv = PyTuple_GET_SIZE(convert);
        conv = &PyTuple_GET_ITEM(convert, 0);
    }
    if (!pypl_field_names[0]) {
        for (int f = 0; f <= F_CU_SEQLENS; f++) {
            pypl_field_names[f] = PyUnicode_InternFromString(names[f]);
            if (!pypl_field_names[f]) return NULL;
        }
        pypl_max_seqlen_name = PyUnicode_InternFromString("max_seqlen");
        if (!pypl_max_seqlen_name) return NULL;
    }
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    static const uint32_t bits[] = {PL_FIELD_INPUT_IDS, PL_FIELD_LABELS, PL_FIELD_LOSS_MASK,
                                    PL_FIELD_POSITION_IDS, PL_FIELD_CU_SEQLENS};
    for (int f = 0; f <= F_CU_SEQLENS; f++) {
        if (!(b->fields & bits[f])) continue;
        PyObject *v = batch_export(b, f, writable, dlpack, conv, nconv);
        if (v == Py_None) {
            Py_DECREF(v);
            continue;
        }
        if (!v || PyDict_SetItem(d, pypl_field_names[f], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    /* Images of webdataset sources: present only when the micro-batch has some. */
    static const char *const inames[] = {"pixel_values", "image_grid_thw", "image_positions"};
    for (int f = F_PIXEL_VALUES; b->n_images > 0 && f <= F_IMAGE_POSITIONS; f++) {
        PyObject *v = batch_export(b, f, writable, dlpack, conv, nconv);
        if (v == Py_None) {
            Py_DECREF(v);
            continue;
        }
        if (!v || PyDict_SetItemString(d, inames[f - F_PIXEL_VALUES], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    if (b->fields & PL_FIELD_MAX_SEQLEN) {
        PyObject *v = PyLong_FromLongLong((long long)b->max_seqlen);
        if (!v || PyDict_SetItem(d, pypl_max_seqlen_name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    /* The step's and the rank's loss tokens (pl_batch; -1: not known), with
       the loss mask. */
    const int64_t lt[2] = {b->step_loss_tokens, b->rank_loss_tokens};
    static const char *const lnames[2] = {"step_loss_tokens", "rank_loss_tokens"};
    if (b->fields & PL_FIELD_INPUT_IDS) { /* what is not a row's trailing padding */
        PyObject *v = PyLong_FromLongLong((long long)b->tokens);
        if (!v || PyDict_SetItemString(d, "non_padding_tokens", v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    for (int k = 0; (b->fields & PL_FIELD_LOSS_MASK) && k < 2; k++) {
        PyObject *v = PyLong_FromLongLong((long long)lt[k]);
        if (!v || PyDict_SetItemString(d, lnames[k], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

/* Batch.to_dict(convert=None, writable=False, dlpack=None). */
static PyObject *batch_to_dict(PyPlBatch *o, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    PyObject *convert = Py_None, *dlpack = NULL;
    int writable = 0;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "to_dict takes at most one positional argument");
        return NULL;
    }
    if (nargs == 1) convert = args[0];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
        if (PyUnicode_CompareWithASCIIString(k, "convert") == 0) convert = v;
        else if (PyUnicode_CompareWithASCIIString(k, "writable") == 0) {
            writable = PyObject_IsTrue(v);
            if (writable < 0) return NULL;
        } else if (PyUnicode_CompareWithASCIIString(k, "dlpack") == 0) {
            dlpack = v == Py_None ? NULL : v;
        } else {
            PyErr_Format(PyExc_TypeError, "to_dict: unexpected keyword argument %R", k);
            return NULL;
        }
    }
    pl_batch *b = batch_get(o);
    if (!b) return NULL;
    return pypl_batch_dict(b, convert, writable, dlpack);
}

static PyObject *batch_release(PyPlBatch *o, PyObject *unused) {
    (void)unused;
    batch_drop(o);
    Py_RETURN_NONE;
}

static PyObject *batch_get_released(PyPlBatch *o, void *c) {
    (void)c;
    return PyBool_FromLong(o->b == NULL);
}

static PyObject *batch_repr(PyPlBatch *o) {
    if (!o->b) return PyUnicode_FromString("<polyload._core.Batch released>");
    return PyUnicode_FromFormat("<polyload._core.Batch step=%lld micro_batch=%lld "
                                "dp_rank=%lld [%lld, %lld] %s>",
                                (long long)o->b->step, (long long)o->b->micro_batch,
                                (long long)o->b->dp_rank, (long long)o->b->rows,
                                (long long)o->b->cols, pl_dtype_name(o->b->dtype));
}

static PyGetSetDef batch_getset[] = {
    {"step", (getter)batch_get_step, NULL, "int: training step (zero-based)", NULL},
    {"micro_batch", (getter)batch_get_micro_batch, NULL,
     "int: micro-batch within the step, 0 .. micro_batches_per_rank-1", NULL},
    {"dp_rank", (getter)batch_get_dp_rank, NULL, "int: DP rank whose data this is", NULL},
    {"rows", (getter)batch_get_rows, NULL, "int: micro_batch_size", NULL},
    {"cols", (getter)batch_get_cols, NULL, "int: seq_length / cp", NULL},
    {"dtype", (getter)batch_get_dtype, NULL,
     "str: dtype of input_ids and labels ('int64' or 'int32')", NULL},
    {"fields", (getter)batch_get_fields, NULL, "int: FIELD_* bits present", NULL},
    {"n_cu_seqlens", (getter)batch_get_n_cu_seqlens, NULL,
     "int: length of cu_seqlens (segments + 1); 0 when absent", NULL},
    {"max_seqlen", (getter)batch_get_max_seqlen, NULL,
     "int or None: the longest segment, in tokens", NULL},
    {"tokens", (getter)batch_get_tokens, NULL, "int: non-padding tokens", NULL},
    {"n_chunks", (getter)batch_get_n_chunks, NULL,
     "int: segments that are not padding", NULL},
    {"input_ids", (getter)batch_get_array, NULL,
     "Array [rows, cols] int64 (int32 with dtype: int32), or None", (void *)F_INPUT_IDS},
    {"labels", (getter)batch_get_array, NULL,
     "Array [rows, cols], dtype of input_ids; -100 where loss_mask is 0; or None",
     (void *)F_LABELS},
    {"loss_mask", (getter)batch_get_array, NULL, "Array [rows, cols] float32, or None",
     (void *)F_LOSS_MASK},
    {"position_ids", (getter)batch_get_array, NULL,
     "Array [rows, cols] int64, restarting at 0 at each segment; or None",
     (void *)F_POSITION_IDS},
    {"cu_seqlens", (getter)batch_get_array, NULL,
     "Array [n_cu_seqlens] int32 over the flattened rows*cols tokens, or None",
     (void *)F_CU_SEQLENS},
    {"segment_sources", (getter)batch_get_array, NULL,
     "Array [n_cu_seqlens - 1] int32: the config index of the source of each segment of "
     "cu_seqlens, -1 for a row's trailing padding; or None with cu_seqlens",
     (void *)F_SEGMENT_SOURCES},
    {"n_images", (getter)batch_get_n_images, NULL,
     "int: images of webdataset sources in this micro-batch", NULL},
    {"visual_tokens", (getter)batch_get_visual_tokens, NULL,
     "int: image placeholder tokens (sum of image_positions[:, 1])", NULL},
    {"step_loss_tokens", (getter)batch_get_step_loss_tokens, NULL,
     "int: loss tokens of the whole step (every DP rank and micro-batch); -1 when\n"
     "the step holds instruction data or images (count loss_mask instead)", NULL},
    {"rank_loss_tokens", (getter)batch_get_rank_loss_tokens, NULL,
     "int: loss tokens of this DP rank's micro-batches of the step; -1 as above", NULL},
    {"image_mode", (getter)batch_get_image_mode, NULL,
     "int: IMAGE_FIXED (1) or IMAGE_NATIVE (2); 0 without images", NULL},
    {"pixel_values", (getter)batch_get_array, NULL,
     "Array uint8: fixed mode [n_images, 3, H, W]; native mode [n_patches, 3*p*p]\n"
     "(Qwen2-VL patch order); None without images",
     (void *)F_PIXEL_VALUES},
    {"image_grid_thw", (getter)batch_get_array, NULL,
     "Array [n_images, 3] int64: (t, h, w) in patches; None without images",
     (void *)F_IMAGE_GRID_THW},
    {"image_positions", (getter)batch_get_array, NULL,
     "Array [n_images, 2] int64: flattened offset in input_ids of each image's first\n"
     "placeholder token, and their count; None without images",
     (void *)F_IMAGE_POSITIONS},
    {"released", (getter)batch_get_released, NULL, "bool: release() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef batch_methods[] = {
    {"to_dict", (PyCFunction)(void (*)(void))batch_to_dict, METH_FASTCALL | METH_KEYWORDS,
     "to_dict(convert=None, writable=False, dlpack=None)\n\n"
     "The micro-batch as a dict (SPEC section 3): each present array field, plus\n"
     "'max_seqlen' (int) when present.  convert: a tuple of callables applied in\n"
     "turn to each field's Array (e.g. (numpy.asarray, torch.from_numpy)); None\n"
     "leaves the Arrays.  writable=True exports the fields writable: only for a\n"
     "batch that no other rank receives (the memory is shared by the served ranks\n"
     "of a DP group; polyload.Loader decides from the topology).  Default: read-only.\n"
     "dlpack: a callable taking a DLPack capsule (\"dltensor\", CPU, compact\n"
     "row-major, the unversioned ABI), e.g. torch.from_dlpack: each field goes to it\n"
     "instead of through convert, zero-copy; the memory is writable to the consumer\n"
     "(DLPack has no read-only flag), so only with writable=True."},
    {"release", (PyCFunction)batch_release, METH_NOARGS,
     "release()\n\nDrop this Batch's reference now.  Arrays taken from it stay valid."},
    {"__reduce__", pypl_no_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PyPl_BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polyload._core.Batch",
    .tp_basicsize = sizeof(PyPlBatch),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_repr = (reprfunc)batch_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One micro-batch (pl_batch, SPEC section 3), retained for as long as this\n"
              "object lives.  Each field is an Array sharing the C memory (zero-copy);\n"
              "fields the rank does not receive are None.",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};
