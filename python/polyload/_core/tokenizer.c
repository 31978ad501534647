/*
 * tokenizer.c -- Python tokenizers as pl_tokenizers, for raw text sources:
 * Hugging Face `tokenizers` (config `tokenizer: {type: hf, path:
 * tokenizer.json}`) and tiktoken (`{type: tiktoken, path: FILE.tiktoken,
 * encoding: NAME | pat_str: REGEX}`).
 *
 * `type: hf` files are encoded by the library polyload._hfbackend.load
 * picks (config `backend`: auto, fastokens or tokenizers): fastokens'
 * Tokenizer.encode_batch_flat(texts, add_special_tokens=False) returns a
 * batch's ids as one buffer of little-endian uint32 and n + 1 uint64
 * offsets, read here without a Python object per token;
 * tokenizers.Tokenizer.encode_batch_fast returns an Encoding per text.
 *
 * Every Config this extension parses carries pypl_tokenizer_factory
 * (pl_config_set_tokenizer_factory_spec), so the loaders, planners and sources
 * made from it, in this process or in Ray actors, tokenize with
 * `tokenizers.Tokenizer.from_file(path)` or polyload._tiktoken.load_encoding.
 * The C source loader calls encode_batch from its own threads, a batch of
 * documents at a time; the callback takes the GIL (PyGILState_Ensure) only
 * for the call: Tokenizer.encode_batch_fast(texts, add_special_tokens=False)
 * runs in Rust with the GIL released; tiktoken's Encoding.encode_ordinary is
 * called for each text of the batch (its Rust core releases the GIL while it
 * encodes; encode_ordinary_batch would start a thread pool per call), and the
 * ids are copied out into int32 arrays.
 * The end-of-document id is the first of polyload.prepare.EOD_CANDIDATES
 * that the vocabulary (tiktoken: the special tokens) has (as `polyload
 * prepare --append-eod` picks it).
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

typedef struct pyhf {
    PyObject *tok;    /* tokenizers.Tokenizer */
    PyObject *encode; /* its encode_batch_fast (or encode_batch) */
    PyObject *kw;     /* {"add_special_tokens": False} */
    int tiktoken;     /* encode is Encoding.encode_ordinary, one text a call */
    int flat;         /* encode is fastokens' encode_batch_flat: (ids, offsets) */
    char name[1100];
} pyhf;

/* The pending Python exception as a message (and cleared). */
static void pyhf_errmsg(const char *what, char *err, size_t errcap) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *s = v ? PyObject_Str(v) : NULL;
    const char *m = s ? PyUnicode_AsUTF8(s) : NULL;
    snprintf(err, errcap, "%s: %s", what, m ? m : "Python error");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

/* ids[i], counts[i] from encode_batch_flat's (ids: n_ids little-endian
 * uint32, offsets: n + 1 little-endian uint64); GIL held.  On failure
 * nothing is left allocated. */
static int flat_ids(const pyhf *h, PyObject *res, int64_t n, int32_t **ids, int64_t *counts,
                    char *err, size_t errcap) {
    char *ib = NULL, *ob = NULL;
    Py_ssize_t il = 0, ol = 0;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2 ||
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(res, 0), &ib, &il) < 0 ||
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(res, 1), &ob, &ol) < 0) {
        PyErr_Clear();
        snprintf(err, errcap, "%s: encode_batch_flat returned no (ids, offsets) bytes", h->name);
        return PL_EINVAL;
    }
    const uint64_t nid = (uint64_t)il / 4;
    if ((uint64_t)ol != (uint64_t)(n + 1) * 8 || il % 4) {
        snprintf(err, errcap, "%s: encode_batch_flat returned %zd offset bytes for %lld texts",
                 h->name, ol, (long long)n);
        return PL_EINVAL;
    }
    uint64_t prev = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t a, b;
        memcpy(&a, ob + 8 * i, 8);
        memcpy(&b, ob + 8 * (i + 1), 8);
        if (a != prev || b < a || b > nid) {
            for (int64_t j = 0; j < i; j++) free(ids[j]);
            snprintf(err, errcap, "%s: encode_batch_flat offsets out of order at text %lld",
                     h->name, (long long)i);
            return PL_EINVAL;
        }
        prev = b;
        const size_t m = (size_t)(b - a);
        int32_t *d = m ? malloc(m * sizeof *d) : NULL;
        if (m && !d) {
            for (int64_t j = 0; j < i; j++) free(ids[j]);
            snprintf(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        const unsigned char *s = (const unsigned char *)ib + 4 * a;
        for (size_t j = 0; j < m; j++) {
            uint32_t x = (uint32_t)s[4 * j] | (uint32_t)s[4 * j + 1] << 8 |
                         (uint32_t)s[4 * j + 2] << 16 | (uint32_t)s[4 * j + 3] << 24;
            d[j] = x > INT32_MAX ? -1 : (int32_t)x;
        }
        ids[i] = d;
        counts[i] = (int64_t)m;
    }
    return PL_OK;
}

static int pyhf_encode(void *ctx, int64_t n, const char *const *texts,
                       const size_t *lens, int32_t **ids, int64_t *counts,
                       char *err, size_t errcap) {
    pyhf *h = ctx;
    if (!Py_IsInitialized()) {
        snprintf(err, errcap, "the Python interpreter is not running");
        return PL_ECLOSED;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PL_OK;
    int64_t done = 0;
    PyObject *list = PyList_New((Py_ssize_t)n), *res = NULL;
    if (!list) goto pyerr;
    for (int64_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(texts[i], (Py_ssize_t)lens[i], "strict");
        if (!s) goto pyerr;
        PyList_SET_ITEM(list, (Py_ssize_t)i, s);
    }
    if (h->flat) {
        PyObject *args = PyTuple_Pack(1, list);
        if (!args) goto pyerr;
        res = PyObject_Call(h->encode, args, h->kw);
        Py_DECREF(args);
        if (!res) goto pyerr;
        rc = flat_ids(h, res, n, ids, counts, err, errcap);
        if (rc == PL_OK) done = n;
        goto out;
    }
    if (h->tiktoken) {
        res = PyList_New((Py_ssize_t)n);
        if (!res) goto pyerr;
        for (int64_t i = 0; i < n; i++) {
            PyObject *v = PyObject_CallOneArg(h->encode, PyList_GET_ITEM(list, (Py_ssize_t)i));
            if (!v) goto pyerr;
            PyList_SET_ITEM(res, (Py_ssize_t)i, v);
        }
    } else {
        PyObject *args = PyTuple_Pack(1, list);
        if (!args) goto pyerr;
        res = PyObject_Call(h->encode, args, h->kw);
        Py_DECREF(args);
        if (!res) goto pyerr;
    }
    if (!PyList_Check(res) || PyList_GET_SIZE(res) != (Py_ssize_t)n) {
        snprintf(err, errcap, "%s: encode_batch returned no list of %lld", h->name,
                 (long long)n);
        rc = PL_EINVAL;
        goto out;
    }
    for (; done < n; done++) {
        PyObject *item = PyList_GET_ITEM(res, (Py_ssize_t)done), *v;
        if (h->tiktoken) {
            v = item;
            Py_INCREF(v);
        } else {
            v = PyObject_GetAttrString(item, "ids");
            if (!v) goto pyerr;
        }
        Py_ssize_t m = PyList_Check(v) ? PyList_GET_SIZE(v) : -1;
        if (m < 0) {
            Py_DECREF(v);
            snprintf(err, errcap, "%s: the ids are not a list", h->name);
            rc = PL_EINVAL;
            goto out;
        }
        int32_t *a = m ? malloc((size_t)m * sizeof *a) : NULL;
        if (m && !a) {
            Py_DECREF(v);
            snprintf(err, errcap, "out of memory");
            rc = PL_ENOMEM;
            goto out;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            long x = PyLong_AsLong(PyList_GET_ITEM(v, j));
            a[j] = (int32_t)(x < 0 || x > INT32_MAX ? -1 : x);
        }
        Py_DECREF(v);
        ids[done] = a;
        counts[done] = (int64_t)m;
    }
    goto out;
pyerr:
    pyhf_errmsg(h->name, err, errcap);
    rc = PL_EINVAL;
out:
    if (rc)
        for (int64_t i = 0; i < done; i++) free(ids[i]);
    Py_XDECREF(res);
    Py_XDECREF(list);
    PyGILState_Release(g);
    return rc;
}

static void pyhf_destroy(void *ctx) {
    pyhf *h = ctx;
    if (!h) return;
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF(h->encode);
        Py_XDECREF(h->kw);
        Py_XDECREF(h->tok);
        PyGILState_Release(g);
    }
    free(h);
}

/* tiktoken: polyload._tiktoken.load_encoding(path, pat_str, encoding) ->
 * (Encoding, eos_id, n_vocab); GIL held. */
static int pytiktoken_create(pyhf *h, const pl_tokenizer_spec *spec, int64_t *eos,
                             int64_t *vocab, char *err, size_t errcap) {
    PyObject *mod = PyImport_ImportModule("polyload._tiktoken"), *res = NULL;
    if (!mod) goto pyerr;
    res = PyObject_CallMethod(mod, "load_encoding", "szz", spec->path, spec->pat_str,
                              spec->encoding);
    if (!res) goto pyerr;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 3) {
        snprintf(err, errcap, "%s: load_encoding gave no (encoding, eos, n_vocab)", h->name);
        Py_DECREF(res);
        Py_DECREF(mod);
        return PL_ECONFIG;
    }
    h->tok = PyTuple_GET_ITEM(res, 0);
    Py_INCREF(h->tok);
    *eos = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
    *vocab = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 2));
    if (PyErr_Occurred()) goto pyerr;
    h->encode = PyObject_GetAttrString(h->tok, "encode_ordinary");
    if (!h->encode) goto pyerr;
    h->tiktoken = 1;
    Py_DECREF(res);
    Py_DECREF(mod);
    return PL_OK;
pyerr:
    pyhf_errmsg(h->name, err, errcap);
    Py_XDECREF(res);
    Py_XDECREF(mod);
    return PL_ECONFIG;
}

int pypl_tokenizer_factory(void *ctx, const pl_tokenizer_spec *spec, pl_tokenizer *out,
                           char *err, size_t errcap) {
    (void)ctx;
    const char *type = spec->type, *path = spec->path;
    const int tk = strcmp(type, "tiktoken") == 0;
    if (strcmp(type, "hf") != 0 && !tk) {
        snprintf(err, errcap,
                 "tokenizer type %s (%s) is not supported here (hf, tiktoken and bytes "
                 "are, and sentencepiece in a library built with libsentencepiece)",
                 type, path);
        return PL_ECONFIG;
    }
    pyhf *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    snprintf(h->name, sizeof h->name, "%s:%s", tk ? "tiktoken" : "hf", path);
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PL_OK;
    int64_t eos = -1, vocab = 0;
    PyObject *mod = NULL, *cls = NULL, *cands = NULL;
    if (tk) {
        rc = pytiktoken_create(h, spec, &eos, &vocab, err, errcap);
        goto out;
    }
    const char *backend =
        spec->version >= 2 && spec->backend ? spec->backend : "auto";
    mod = PyImport_ImportModule("polyload._hfbackend");
    if (!mod) goto pyerr;
    cls = PyObject_CallMethod(mod, "load", "ss", path, backend); /* (library, tok) */
    if (!cls) goto pyerr;
    if (!PyTuple_Check(cls) || PyTuple_GET_SIZE(cls) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(cls, 0))) {
        snprintf(err, errcap, "%s: polyload._hfbackend.load gave no (library, tokenizer)",
                 h->name);
        rc = PL_ECONFIG;
        goto out;
    }
    h->flat = strcmp(PyUnicode_AsUTF8(PyTuple_GET_ITEM(cls, 0)), "fastokens") == 0;
    h->tok = PyTuple_GET_ITEM(cls, 1);
    Py_INCREF(h->tok);
    snprintf(h->name, sizeof h->name, "hf:%s", path);
    if (h->flat) {
        h->encode = PyObject_GetAttrString(h->tok, "encode_batch_flat");
        if (!h->encode) goto pyerr;
    } else {
        h->encode = PyObject_GetAttrString(h->tok, "encode_batch_fast");
        if (!h->encode) {
            PyErr_Clear();
            h->encode = PyObject_GetAttrString(h->tok, "encode_batch");
            if (!h->encode) goto pyerr;
        }
    }
    h->kw = Py_BuildValue("{s:O}", "add_special_tokens", Py_False);
    if (!h->kw) goto pyerr;
    PyObject *vs = h->flat ? PyObject_GetAttrString(h->tok, "vocab_size")
                           : PyObject_CallMethod(h->tok, "get_vocab_size", "O", Py_True);
    if (!vs) goto pyerr;
    vocab = PyLong_AsLongLong(vs);
    Py_DECREF(vs);
    PyObject *prep = PyImport_ImportModule("polyload.prepare");
    if (!prep) goto pyerr;
    cands = PyObject_GetAttrString(prep, "EOD_CANDIDATES");
    Py_DECREF(prep);
    if (!cands) goto pyerr;
    for (Py_ssize_t i = 0; i < PyTuple_Size(cands) && eos < 0; i++) {
        PyObject *id = PyObject_CallMethod(h->tok, "token_to_id", "O",
                                           PyTuple_GET_ITEM(cands, i));
        if (!id) goto pyerr;
        if (id != Py_None) eos = PyLong_AsLongLong(id);
        Py_DECREF(id);
    }
    goto out;
pyerr:
    pyhf_errmsg(h->name, err, errcap);
    rc = PL_ECONFIG;
out:
    Py_XDECREF(cands);
    Py_XDECREF(cls);
    Py_XDECREF(mod);
    PyGILState_Release(g);
    if (rc) {
        pyhf_destroy(h);
        return rc;
    }
    memset(out, 0, sizeof *out);
    out->version = PL_TOKENIZER_VERSION;
    out->ctx = h;
    out->encode_batch = pyhf_encode;
    out->destroy = pyhf_destroy;
    out->eos_id = eos;
    out->vocab_size = vocab;
    out->name = h->name;
    return PL_OK;
}

/* ------------------------------------------------------------- lengths */

/*
 * Config.set_lengths_provider(fn): raw text sources opened from this config
 * hold lengths only, asked of fn(source_index, [document indices]) ->
 * (lengths, {position: message}) from the sources' threads (GIL taken for
 * the call).  The Ray planner actor answers with its source loaders'.
 */
int pypl_lengths_provider(void *ctx, int64_t source, int64_t n, const int64_t *index,
                          int64_t *lengths, char **messages, char *err, size_t errcap) {
    PyObject *fn = ctx;
    if (!Py_IsInitialized()) {
        snprintf(err, errcap, "the Python interpreter is not running");
        return PL_ECLOSED;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PL_OK;
    PyObject *list = PyList_New((Py_ssize_t)n), *res = NULL, *seq = NULL;
    if (!list) goto pyerr;
    for (int64_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong((long long)index[i]);
        if (!v) goto pyerr;
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    res = PyObject_CallFunction(fn, "LO", (long long)source, list);
    if (!res) goto pyerr;
    PyObject *lens = res, *msgs = NULL;
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
        lens = PyTuple_GET_ITEM(res, 0);
        msgs = PyTuple_GET_ITEM(res, 1);
    }
    seq = PySequence_Fast(lens, "lengths provider: expected a sequence of int");
    if (!seq) goto pyerr;
    if (PySequence_Fast_GET_SIZE(seq) != (Py_ssize_t)n) {
        snprintf(err, errcap, "lengths provider returned %zd lengths for %lld documents",
                 PySequence_Fast_GET_SIZE(seq), (long long)n);
        rc = PL_EINVAL;
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
        if (v == -1 && PyErr_Occurred()) goto pyerr;
        lengths[i] = (int64_t)v;
        if (v < 0 && msgs && PyDict_Check(msgs)) {
            PyObject *k = PyLong_FromLongLong((long long)i);
            PyObject *m = k ? PyDict_GetItem(msgs, k) : NULL;
            Py_XDECREF(k);
            const char *s = m && PyUnicode_Check(m) ? PyUnicode_AsUTF8(m) : NULL;
            if (s) messages[i] = strdup(s);
        }
    }
    goto out;
pyerr:
    pyhf_errmsg("lengths provider", err, errcap);
    rc = PL_EIO;
out:
    Py_XDECREF(seq);
    Py_XDECREF(res);
    Py_XDECREF(list);
    PyGILState_Release(g);
    return rc;
}
