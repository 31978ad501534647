/*
 * source/tokenizer/share.c -- the tokenizers of raw text sources opened through a
 * config: one loaded tokenizer per file in a process, released and built
 * again on demand, and the heap given back after tokenizing.
 *
 * Sharing.  A source opened from a config gets a wrapper pl_tokenizer
 * (pl__tokref) whose encode_batch calls a loaded tokenizer kept in a
 * process-wide table, keyed by how it is built (the config's factory and its
 * ctx, or the built-in SentencePiece), the `tokenizer:` settings (type, path,
 * pat_str, encoding) and the identity of the file (st_dev, st_ino, st_size,
 * st_mtim): the sources of a process that name the same tokenizer file load
 * it once (a top-level `tokenizer:` names one file for every source).  The
 * table counts references; the last source that lets go destroys it.  A
 * tokenizer's encode_batch must already be thread-safe (pl_tokenizer), so
 * sharing it between sources changes no token.  Files that cannot be stat'ed
 * are built unshared (the factory reports what is wrong).
 *
 * Release (pl_source_release_tokenizer).  A source that serves nothing yet (a
 * standby replica) drops its reference; the next encode_batch takes one again
 * (loading the file if no other source holds it) and checks that the file is
 * the one first loaded, so that the tokens cannot differ from the ones
 * planned elsewhere (PL_ECONFIG naming the file when it changed).
 *
 * Locking: the table has one mutex, held only to look up, insert and count;
 * factories run outside it (a Python factory takes the GIL, and a thread
 * holding the GIL may be waiting on the table).  Two threads that build the
 * same missing tokenizer at once both build it; the second to finish uses
 * the first's and destroys its own.  A wrapper has a mutex and a count of
 * calls in flight; release waits for them.
 *
 * Pool (pl_set_tokenize_threads).  Where a process sets one, the raw text
 * sources' tokenizing (parse, encode_batch, building the kept ids) and the
 * loading of tokenizers run on its threads, the callers waiting, and always
 * on the same thread for the same tokenizer file (the hash of its path picks
 * it).  Measured
 * (docs/internals/decisions/0005-one-tokenizer-thread-per-file.md): a
 * tokenizer used from two threads leaves ~5 MiB more heap per source than
 * from one, serialized or not, whatever the number of malloc arenas (state
 * the tokenizer library keeps per thread that uses it, not broken down
 * further).
 *
 * Heap.  Tokenizer libraries allocate and free many small blocks while they
 * load and encode, from every thread that calls them; glibc keeps freed
 * pages in its arenas.  pl__heap_trim_soon gives free pages back
 * (malloc_trim(0)) at most every PL__TRIM_EVERY_NS, after a batch was
 * tokenized; release trims at once.
 */
#include "source/tokenizer/tokenizer.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define PL__TRIM_EVERY_NS 100000000LL /* 100 ms */

typedef struct pl__tokkey {
    int type;
    char *path, *pat_str, *encoding, *backend;
    pl_tokenizer_factory fn;
    pl_tokenizer_spec_factory spec_fn;
    void *ctx;
    int have_stat;
    uint64_t dev, ino;
    int64_t size, mtime_s, mtime_ns;
} pl__tokkey;

typedef struct pl__tokshared {
    struct pl__tokshared *next;
    pl__tokkey key; /* strings owned */
    pl_tokenizer tok;
    int64_t refs;
    int listed; /* in the table (else built unshared) */
} pl__tokshared;

typedef struct pl__tokref {
    pl__tokkey key; /* the recipe (strings owned); stat fields: the file as
                       first loaded */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pl__tokshared *e; /* NULL: released */
    int64_t busy;     /* encode_batch calls in flight on e */
    int64_t builds;   /* references taken (1 + rebuilds after release) */
    char *name;
} pl__tokref;

static int ref_encode(void *ctx, int64_t n, const char *const *texts, const size_t *lens,
                      int32_t **ids, int64_t *counts, char *err, size_t errcap);

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pl__tokshared *g_head;
static atomic_llong g_last_trim;
static atomic_llong g_loads; /* tokenizers built (for tests) */

static const char *const tok_type_names[] = {"", "bytes", "hf", "sentencepiece",
                                             "tiktoken"};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void pl__heap_trim(void) {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    atomic_store(&g_last_trim, (long long)now_ns());
}

void pl__heap_trim_soon(void) {
    long long last = atomic_load(&g_last_trim), now = (long long)now_ns();
    if (now - last < PL__TRIM_EVERY_NS) return;
    if (!atomic_compare_exchange_strong(&g_last_trim, &last, now)) return;
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

/* ------------------------------------------------------------ the pool */

typedef struct pl__tokjob {
    void (*fn)(void *);
    void *arg;
    int done;
    struct pl__tokjob *next;
} pl__tokjob;

typedef struct pl__tokthread {
    pl__tokjob *head, *tail;
    pthread_cond_t work;
    int running;
} pl__tokthread;

#define PL__POOL_MAX 256
static pthread_mutex_t p_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t p_done = PTHREAD_COND_INITIALIZER;
static pl__tokthread p_th[PL__POOL_MAX];
static int p_want, p_started;
static _Thread_local int p_in_pool;

static void *pool_main(void *arg) {
    pl__tokthread *me = arg;
    p_in_pool = 1;
    pthread_mutex_lock(&p_mu);
    for (;;) {
        while (!me->head) pthread_cond_wait(&me->work, &p_mu);
        pl__tokjob *j = me->head;
        me->head = j->next;
        if (!me->head) me->tail = NULL;
        pthread_mutex_unlock(&p_mu);
        j->fn(j->arg);
        pthread_mutex_lock(&p_mu);
        j->done = 1;
        pthread_cond_broadcast(&p_done);
    }
    return NULL; /* not reached: the threads live as long as the process */
}

int pl_set_tokenize_threads(int threads) {
    if (threads < 0 || threads > PL__POOL_MAX) return PL_EINVAL;
    pthread_mutex_lock(&p_mu);
    int rc = PL_OK;
    while (p_started < threads) {
        pl__tokthread *t = &p_th[p_started];
        pthread_cond_init(&t->work, NULL);
        pthread_t th;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int e = pthread_create(&th, &a, pool_main, t);
        pthread_attr_destroy(&a);
        if (e) {
            pthread_cond_destroy(&t->work);
            rc = PL_ENOMEM;
            break;
        }
        t->running = 1;
        p_started++;
    }
    /* fewer wanted: the threads beyond stay idle (jobs go to the first ones) */
    p_want = rc == PL_OK ? threads : p_started;
    pthread_mutex_unlock(&p_mu);
    return rc;
}

int pl_tokenize_threads(void) {
    pthread_mutex_lock(&p_mu);
    int n = p_want;
    pthread_mutex_unlock(&p_mu);
    return n;
}

void pl__tokpool_run(uint64_t key, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&p_mu);
    if (p_in_pool || p_want == 0) {
        pthread_mutex_unlock(&p_mu);
        fn(arg);
        return;
    }
    pl__tokthread *t = &p_th[key % (uint64_t)p_want];
    pl__tokjob j = {fn, arg, 0, NULL};
    if (t->tail) t->tail->next = &j;
    else t->head = &j;
    t->tail = &j;
    pthread_cond_signal(&t->work);
    while (!j.done) pthread_cond_wait(&p_done, &p_mu);
    pthread_mutex_unlock(&p_mu);
}

uint64_t pl__tokref_key(const pl_tokenizer *tok) {
    if (!tok || tok->encode_batch != ref_encode) return (uint64_t)(uintptr_t)tok / 64;
    const pl__tokref *r = tok->ctx;
    const char *p = r->key.path ? r->key.path : "";
    return pl__hash64(p, strlen(p), (uint64_t)r->key.type);
}

int64_t pl__tokenizers_loaded(void) { return (int64_t)atomic_load(&g_loads); }

static int str_eq(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static int key_eq(const pl__tokkey *a, const pl__tokkey *b) {
    return a->type == b->type && a->fn == b->fn && a->spec_fn == b->spec_fn &&
           a->ctx == b->ctx && a->have_stat && b->have_stat && a->dev == b->dev &&
           a->ino == b->ino && a->size == b->size && a->mtime_s == b->mtime_s &&
           a->mtime_ns == b->mtime_ns && str_eq(a->path, b->path) &&
           str_eq(a->pat_str, b->pat_str) && str_eq(a->encoding, b->encoding) &&
           str_eq(a->backend, b->backend);
}

static void key_free(pl__tokkey *k) {
    free(k->path);
    free(k->pat_str);
    free(k->encoding);
    free(k->backend);
    memset(k, 0, sizeof *k);
}

static int key_dup(pl__tokkey *dst, const pl__tokkey *src) {
    *dst = *src;
    dst->path = pl__strdup(src->path);
    dst->pat_str = pl__strdup(src->pat_str);
    dst->encoding = pl__strdup(src->encoding);
    dst->backend = pl__strdup(src->backend);
    if ((src->path && !dst->path) || (src->pat_str && !dst->pat_str) ||
        (src->encoding && !dst->encoding) || (src->backend && !dst->backend)) {
        key_free(dst);
        return PL_ENOMEM;
    }
    return PL_OK;
}

/* The file's identity now (have_stat 0 when it cannot be stat'ed). */
static void key_stat(pl__tokkey *k) {
    struct stat st;
    k->have_stat = k->path && k->path[0] && stat(k->path, &st) == 0;
    if (!k->have_stat) return;
    k->dev = (uint64_t)st.st_dev;
    k->ino = (uint64_t)st.st_ino;
    k->size = (int64_t)st.st_size;
    k->mtime_s = (int64_t)st.st_mtim.tv_sec;
    k->mtime_ns = (int64_t)st.st_mtim.tv_nsec;
}

/* Build the tokenizer of k with its factory (no lock held). */
static int build_here(const pl__tokkey *k, pl_tokenizer *tok, char *err, size_t errcap) {
    memset(tok, 0, sizeof *tok);
    int rc;
    err[0] = '\0';
#ifdef PL_WITH_SENTENCEPIECE
    if (k->type == PL__TOK_SENTENCEPIECE && !k->fn && !k->spec_fn) {
        rc = pl__spm_create(k->path ? k->path : "", tok, err, errcap);
        if (rc == PL_OK) atomic_fetch_add(&g_loads, 1);
        return rc;
    }
#endif
    if (k->spec_fn) {
        pl_tokenizer_spec sp;
        memset(&sp, 0, sizeof sp);
        sp.version = PL_TOKENIZER_SPEC_VERSION;
        sp.type = tok_type_names[k->type];
        sp.path = k->path ? k->path : "";
        sp.pat_str = k->pat_str;
        sp.encoding = k->encoding;
        sp.backend = k->backend;
        rc = k->spec_fn(k->ctx, &sp, tok, err, errcap);
    } else if (k->fn) {
        rc = k->fn(k->ctx, tok_type_names[k->type], k->path ? k->path : "", tok, err,
                   errcap);
    } else {
        pl__fmt(err, errcap,
                "tokenizer type %s (%s) is not built into the C library (built "
                "in: bytes, and sentencepiece where built with libsentencepiece); it "
                "needs a host that provides it, e.g. the Python package "
                "(polyload.Loader, or the polyload command it installs: "
                "python -m polyload)",
                tok_type_names[k->type], k->path ? k->path : "");
        return PL_ECONFIG;
    }
    if (rc == PL_OK && (tok->version != PL_TOKENIZER_VERSION || !tok->encode_batch)) {
        if (tok->destroy) tok->destroy(tok->ctx);
        memset(tok, 0, sizeof *tok);
        pl__fmt(err, errcap, "tokenizer factory gave no encode_batch");
        rc = PL_EINVAL;
    }
    if (rc == PL_OK) atomic_fetch_add(&g_loads, 1);
    return rc;
}

typedef struct {
    const pl__tokkey *k;
    pl_tokenizer *tok;
    char *err;
    size_t errcap;
    int rc;
} build_job;

static void build_run(void *arg) {
    build_job *b = arg;
    b->rc = build_here(b->k, b->tok, b->err, b->errcap);
}

/* Built on the tokenize pool's thread of the file where the process has a
 * pool (pl_set_tokenize_threads): the thread that will tokenize with it. */
static int build(const pl__tokkey *k, pl_tokenizer *tok, char *err, size_t errcap) {
    build_job b = {k, tok, err, errcap, 0};
    const char *p = k->path ? k->path : "";
    pl__tokpool_run(pl__hash64(p, strlen(p), (uint64_t)k->type), build_run, &b);
    return b.rc;
}

static void drop(pl__tokshared *e) {
    if (!e) return;
    pthread_mutex_lock(&g_mu);
    int last = --e->refs == 0;
    if (last && e->listed) {
        for (pl__tokshared **p = &g_head; *p; p = &(*p)->next)
            if (*p == e) {
                *p = e->next;
                break;
            }
    }
    pthread_mutex_unlock(&g_mu);
    if (!last) return;
    if (e->tok.destroy) e->tok.destroy(e->tok.ctx);
    key_free(&e->key);
    free(e);
}

/* A reference to the loaded tokenizer of k (k's stat fields as now). */
static pl__tokshared *acquire(const pl__tokkey *k, char *err, size_t errcap, int *rc) {
    *rc = PL_OK;
    if (k->have_stat) {
        pthread_mutex_lock(&g_mu);
        for (pl__tokshared *e = g_head; e; e = e->next)
            if (key_eq(&e->key, k)) {
                e->refs++;
                pthread_mutex_unlock(&g_mu);
                return e;
            }
        pthread_mutex_unlock(&g_mu);
    }
    pl__tokshared *mine = pl__calloc(1, sizeof *mine);
    if (!mine || key_dup(&mine->key, k) != PL_OK) {
        free(mine);
        pl__fmt(err, errcap, "out of memory");
        *rc = PL_ENOMEM;
        return NULL;
    }
    *rc = build(k, &mine->tok, err, errcap);
    pl__heap_trim_soon(); /* what loading freed (JSON parsing, ...) goes back */
    if (*rc != PL_OK) {
        key_free(&mine->key);
        free(mine);
        return NULL;
    }
    mine->refs = 1;
    if (!k->have_stat) return mine;
    pthread_mutex_lock(&g_mu);
    for (pl__tokshared *e = g_head; e; e = e->next)
        if (key_eq(&e->key, k)) { /* built meanwhile by another thread */
            e->refs++;
            pthread_mutex_unlock(&g_mu);
            drop(mine);
            return e;
        }
    mine->listed = 1;
    mine->next = g_head;
    g_head = mine;
    pthread_mutex_unlock(&g_mu);
    return mine;
}

/* A reference for r (taken if released), or NULL with a message; r->mu held
 * by the caller, and released meanwhile while building. */
static pl__tokshared *ref_ensure(pl__tokref *r, char *err, size_t errcap, int *rc) {
    *rc = PL_OK;
    while (!r->e) {
        pl__tokkey now = r->key;
        key_stat(&now);
        if (r->key.have_stat &&
            (!now.have_stat || now.dev != r->key.dev || now.ino != r->key.ino ||
             now.size != r->key.size || now.mtime_s != r->key.mtime_s ||
             now.mtime_ns != r->key.mtime_ns)) {
            pl__fmt(err, errcap,
                    "tokenizer %s: the file %s changed (or went) since the source was "
                    "opened; its tokens could differ from the lengths planned with it "
                    "(reopen the sources)",
                    r->name ? r->name : "", r->key.path ? r->key.path : "");
            *rc = PL_ECONFIG;
            return NULL;
        }
        pthread_mutex_unlock(&r->mu);
        pl__tokshared *e = acquire(&r->key, err, errcap, rc);
        pthread_mutex_lock(&r->mu);
        if (!e) return NULL;
        if (!r->e) {
            r->e = e;
            r->builds++;
        } else {
            pthread_mutex_unlock(&r->mu);
            drop(e);
            pthread_mutex_lock(&r->mu);
        }
    }
    return r->e;
}

static int ref_encode(void *ctx, int64_t n, const char *const *texts, const size_t *lens,
                      int32_t **ids, int64_t *counts, char *err, size_t errcap) {
    pl__tokref *r = ctx;
    int rc;
    pthread_mutex_lock(&r->mu);
    pl__tokshared *e = ref_ensure(r, err, errcap, &rc);
    if (e) r->busy++;
    pthread_mutex_unlock(&r->mu);
    if (!e) return rc;
    rc = e->tok.encode_batch(e->tok.ctx, n, texts, lens, ids, counts, err, errcap);
    pthread_mutex_lock(&r->mu);
    if (--r->busy == 0) pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int ref_release(pl__tokref *r) {
    pthread_mutex_lock(&r->mu);
    while (r->busy) pthread_cond_wait(&r->cv, &r->mu);
    pl__tokshared *e = r->e;
    r->e = NULL;
    pthread_mutex_unlock(&r->mu);
    int had = e != NULL;
    drop(e);
    return had;
}

static void ref_destroy(void *ctx) {
    pl__tokref *r = ctx;
    if (!r) return;
    ref_release(r);
    key_free(&r->key);
    free(r->name);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int pl__tokref_create(int type, const char *path, const char *pat_str,
                      const char *encoding, const char *backend, pl_tokenizer_factory fn,
                      pl_tokenizer_spec_factory spec_fn, void *ctx, pl_tokenizer *out,
                      char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    pl__tokref *r = pl__calloc(1, sizeof *r);
    if (!r) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pl__tokkey k = {.type = type, .path = (char *)path, .pat_str = (char *)pat_str,
                    .encoding = (char *)encoding, .backend = (char *)backend,
                    .fn = fn, .spec_fn = spec_fn,
                    .ctx = ctx};
    key_stat(&k);
    int rc = key_dup(&r->key, &k);
    if (rc != PL_OK) {
        pl__fmt(err, errcap, "out of memory");
        ref_destroy(r);
        return rc;
    }
    r->e = acquire(&r->key, err, errcap, &rc);
    if (!r->e) {
        ref_destroy(r);
        return rc;
    }
    r->builds = 1;
    r->name = pl__strdup(r->e->tok.name ? r->e->tok.name : tok_type_names[type]);
    if (!r->name) {
        pl__fmt(err, errcap, "out of memory");
        ref_destroy(r);
        return PL_ENOMEM;
    }
    out->version = PL_TOKENIZER_VERSION;
    out->ctx = r;
    out->encode_batch = ref_encode;
    out->destroy = ref_destroy;
    out->eos_id = r->e->tok.eos_id;
    out->vocab_size = r->e->tok.vocab_size;
    out->name = r->name;
    return PL_OK;
}

int pl__tokref_release(pl_tokenizer *tok) {
    if (!tok || tok->encode_batch != ref_encode) return -1;
    int had = ref_release(tok->ctx);
    if (had) pl__heap_trim();
    return had;
}

int pl__tokref_state(const pl_tokenizer *tok, int64_t *builds, int64_t *shared_by) {
    if (!tok || tok->encode_batch != ref_encode) return -1;
    pl__tokref *r = tok->ctx;
    pthread_mutex_lock(&r->mu);
    int loaded = r->e != NULL;
    if (builds) *builds = r->builds;
    if (shared_by) {
        pthread_mutex_lock(&g_mu);
        *shared_by = r->e ? r->e->refs : 0;
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&r->mu);
    return loaded;
}
