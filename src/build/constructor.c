/*
 * constructor.c -- the data constructor role (docs/internals/design.md,
 * "Roles"): turns the plan of a step and the payloads of its chunks into one
 * micro-batch of SPEC section 3 for a (DP rank, CP rank) pair.  Everything is
 * written straight into the batch's arrays; the only copy of a token is the
 * one from the mapped file.
 *
 * Labels are the next token within the document: a chunk that does not end
 * its document reads one more token so its last position gets a label too
 * (as Megatron's GPTDataset reads seq_length + 1 tokens).  A chunk's padding
 * for CP (up to a multiple of 2*cp) and a row's trailing padding carry
 * pad_id, label -100 and loss_mask 0.  CP rank i keeps pieces i and
 * 2*cp-1-i of each segment cut into 2*cp pieces (the load-balanced layout of
 * Megatron's context parallelism).  position_ids count from 0 in every
 * segment of cu_seqlens (a CP slice keeps the positions of its pieces).
 * segment_sources names the source of every segment (-1: padding).
 * Tokens come through a reader: from the mapped sources (the embedded
 * loader) or from payloads another process read (pl_constructor_build).
 */
#include "build/build.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ pool */

struct pl__pool {
    pthread_mutex_t mu;
    int64_t refs; /* 1 for the owner + 1 per buffer out of the pool */
    pl__batchbuf *free_list;
    int64_t rows, cols, full_cols;
    pl_dtype dtype;
};

int pl__pool_create(int64_t rows, int64_t cols, int64_t full_cols,
                    pl_dtype dtype, pl__pool **out) {
    pl__pool *p = pl__calloc(1, sizeof *p);
    if (!p) return PL_ENOMEM;
    if (pl__mutex_init_busy(&p->mu)) {
        free(p);
        return PL_ENOMEM;
    }
    p->refs = 1;
    p->rows = rows;
    p->cols = cols;
    p->full_cols = full_cols;
    p->dtype = dtype;
    *out = p;
    return PL_OK;
}

static void buf_destroy(pl__batchbuf *b) {
    free(b->b.input_ids);
    free(b->b.labels);
    free(b->b.loss_mask);
    free(b->b.position_ids);
    free(b->b.cu_seqlens);
    free(b->b.segment_sources);
    free(b->b.pixel_values);
    free(b->b.image_grid_thw);
    free(b->b.image_positions);
    free(b->scratch);
    free(b);
}

/* Drop one reference; the last one frees the pool and its free buffers. */
static void pool_unref(pl__pool *p) {
    pthread_mutex_lock(&p->mu);
    int64_t left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left) return;
    while (p->free_list) {
        pl__batchbuf *b = p->free_list;
        p->free_list = b->next_free;
        buf_destroy(b);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void pl__pool_release_owner(pl__pool *p) {
    if (p) pool_unref(p);
}

int pl__pool_get(pl__pool *p, pl__batchbuf **out) {
    pthread_mutex_lock(&p->mu);
    pl__batchbuf *b = p->free_list;
    if (b) p->free_list = b->next_free;
    p->refs++;
    pthread_mutex_unlock(&p->mu);
    if (!b) {
        b = pl__calloc(1, sizeof *b);
        size_t n = (size_t)(p->rows * p->cols), es = pl_dtype_size(p->dtype);
        if (b) {
            b->pool = p;
            b->b.input_ids = pl__calloc(n, es);
            b->b.labels = pl__calloc(n, es);
            b->b.loss_mask = pl__calloc(n, sizeof(float));
            b->b.position_ids = pl__calloc(n, sizeof(int64_t));
            b->cu_cap = p->rows * (p->cols + 1) + 1;
            b->b.cu_seqlens = pl__calloc((size_t)b->cu_cap, sizeof(int32_t));
            b->b.segment_sources = pl__calloc((size_t)b->cu_cap, sizeof(int32_t));
            if (p->full_cols != p->cols) {
                /* a full row of every field plus segment lengths, for CP */
                size_t fc = (size_t)p->full_cols;
                b->scratch = pl__calloc(fc, 2 * es + sizeof(float) +
                                                sizeof(int64_t));
            }
        }
        if (!b || !b->b.input_ids || !b->b.labels || !b->b.loss_mask ||
            !b->b.position_ids || !b->b.cu_seqlens || !b->b.segment_sources ||
            (p->full_cols != p->cols && !b->scratch)) {
            if (b) buf_destroy(b);
            pool_unref(p);
            return PL_ENOMEM;
        }
    }
    atomic_store(&b->refs, 1);
    *out = b;
    return PL_OK;
}

void pl__buf_retain(pl__batchbuf *b) { atomic_fetch_add(&b->refs, 1); }

void pl__buf_release(pl__batchbuf *b) {
    if (!b) return;
    if (atomic_fetch_sub(&b->refs, 1) != 1) return;
    pl__pool *p = b->pool;
    pthread_mutex_lock(&p->mu);
    b->next_free = p->free_list;
    p->free_list = b;
    pthread_mutex_unlock(&p->mu);
    pool_unref(p);
}

/* ------------------------------------------------------------ views */

typedef struct pl__view {
    pl_batch pub; /* first: a pl_batch* is a pl__view* */
    atomic_long refs;
    pl__batchbuf *buf;
} pl__view;

int pl__view_create(pl__batchbuf *buf, uint32_t fields, pl_batch **out) {
    pl__view *v = pl__calloc(1, sizeof *v);
    if (!v) return PL_ENOMEM;
    v->pub = buf->b;
    v->pub.fields = fields;
    if (!(fields & PL_FIELD_INPUT_IDS)) v->pub.input_ids = NULL;
    if (!(fields & PL_FIELD_LABELS)) v->pub.labels = NULL;
    if (!(fields & PL_FIELD_LOSS_MASK)) v->pub.loss_mask = NULL;
    if (!(fields & PL_FIELD_POSITION_IDS)) v->pub.position_ids = NULL;
    if (!(fields & PL_FIELD_CU_SEQLENS)) {
        v->pub.cu_seqlens = NULL;
        v->pub.segment_sources = NULL;
        v->pub.n_cu_seqlens = 0;
    }
    if (!(fields & PL_FIELD_MAX_SEQLEN)) v->pub.max_seqlen = 0;
    if (!(fields & PL_FIELD_INPUT_IDS)) { /* images go with input_ids */
        v->pub.n_images = v->pub.n_patches = v->pub.visual_tokens = 0;
        v->pub.pixel_values = NULL;
        v->pub.image_grid_thw = v->pub.image_positions = NULL;
    }
    atomic_store(&v->refs, 1);
    pl__buf_retain(buf);
    v->buf = buf;
    *out = &v->pub;
    return PL_OK;
}

pl_batch *pl_batch_retain(const pl_batch *batch) {
    if (!batch) return NULL;
    pl__view *v = (pl__view *)(uintptr_t)batch; /* the view is the library's */
    atomic_fetch_add(&v->refs, 1);
    return &v->pub;
}

void pl_batch_release(pl_batch *batch) {
    if (!batch) return;
    pl__view *v = (pl__view *)batch;
    if (atomic_fetch_sub(&v->refs, 1) != 1) return;
    pl__buf_release(v->buf);
    free(v);
}

/* ------------------------------------------------------------ building */

/*
 * Write one full row (full_cols tokens) at ids/lab/mask/pos and record the
 * padded length of each segment in seg[] (*nseg of them).  T is the token
 * type of input_ids and labels.
 */
#define PL__DEFINE_ROW(NAME, T, DT)                                            \
    static int NAME(pl__build_ctx *x, const pl_chunk *cs, int64_t nc,          \
                    int64_t *ordinal, T *ids,                                  \
                    T *lab, float *mask, int64_t *pos, int64_t *seg,           \
                    int64_t *nseg, int64_t *real) {                            \
        int64_t p = 0, S = x->full_cols;                                       \
        *nseg = 0;                                                             \
        for (int64_t j = 0; j < nc; j++) {                                     \
            const pl_chunk *c = &cs[j];                                        \
            int64_t L = c->length, P = (L + x->align - 1) / x->align * x->align; \
            T next = 0;                                                        \
            int end = (c->flags & PL_CHUNK_DOC_END) != 0;                      \
            int rc = x->read(x, (*ordinal)++, c, ids + p, end ? NULL : &next,  \
                             DT);                                              \
            if (rc) return rc;                                                 \
            if (x->has_sft && (pl__sx(&x->cfg->sources[c->source])->prompt_key ||        \
                               pl__sx(&x->cfg->sources[c->source])->messages_key)) { \
                /* Instruction data: prompt tokens come as -1 - id; a label \
                   that is a prompt token is masked. */                        \
                for (int64_t t = 0; t < L; t++) {                              \
                    T v = ids[p + t];                                          \
                    mask[p + t] = v < 0 ? 0.0f : 1.0f;                         \
                    if (v < 0) ids[p + t] = (T)(-1 - v);                       \
                    pos[p + t] = t;                                            \
                }                                                              \
                for (int64_t t = 0; t + 1 < L; t++) {                          \
                    float m = mask[p + t + 1];                                 \
                    mask[p + t] = m;                                           \
                    lab[p + t] = m != 0.0f ? ids[p + t + 1] : (T)-100;         \
                }                                                              \
                if (end) {                                                     \
                    lab[p + L - 1] = (T)-100;                                  \
                    mask[p + L - 1] = 0.0f;                                    \
                } else if (next < 0) {                                         \
                    lab[p + L - 1] = (T)-100;                                  \
                    mask[p + L - 1] = 0.0f;                                    \
                } else {                                                       \
                    lab[p + L - 1] = next;                                     \
                    mask[p + L - 1] = 1.0f;                                    \
                }                                                              \
            } else {                                                           \
            for (int64_t t = 0; t + 1 < L; t++) lab[p + t] = ids[p + t + 1];   \
            for (int64_t t = 0; t < L; t++) {                                  \
                mask[p + t] = 1.0f;                                            \
                pos[p + t] = t;                   \
            }                                                                  \
            if (end) {                                                         \
                lab[p + L - 1] = (T)-100;                                      \
                mask[p + L - 1] = 0.0f;                                        \
            } else {                                                           \
                lab[p + L - 1] = next;                                         \
            }                                                                  \
            }                                                                  \
            for (int64_t t = L; t < P; t++) {                                  \
                ids[p + t] = (T)x->pad_id;                                     \
                lab[p + t] = (T)-100;                                          \
                mask[p + t] = 0.0f;                                            \
                pos[p + t] = t;                   \
            }                                                                  \
            real[*nseg] = L;                                                   \
            seg[(*nseg)++] = P;                                                \
            p += P;                                                            \
        }                                                                      \
        if (p < S) {                                                           \
            real[*nseg] = 0;                                                   \
            seg[(*nseg)++] = S - p;                                            \
            for (int64_t t = 0; p + t < S; t++) {                              \
                ids[p + t] = (T)x->pad_id;                                     \
                lab[p + t] = (T)-100;                                          \
                mask[p + t] = 0.0f;                                            \
                pos[p + t] = t;                                                \
            }                                                                  \
        }                                                                      \
        return PL_OK;                                                          \
    }

PL__DEFINE_ROW(pl__row64, int64_t, PL_DTYPE_INT64)
PL__DEFINE_ROW(pl__row32, int32_t, PL_DTYPE_INT32)

/* Loss tokens of a chunk as the rows give them: its tokens but the
 * document's last (no label there); -1 when the mask depends on the tokens
 * (instruction data's prompts, images' placeholders). */
static int64_t chunk_loss_tokens(const pl__build_ctx *x, const pl_chunk *c) {
    if (c->source < 0 || c->source >= x->cfg->n_sources) return -1;
    const pl__source_cfg *s = &x->cfg->sources[c->source];
    if (pl__type_has_images(s->type) ||
        (x->has_sft && (pl__sx(s)->prompt_key || pl__sx(s)->messages_key)))
        return -1;
    return c->length - ((c->flags & PL_CHUNK_DOC_END) != 0);
}

/* step_loss_tokens and rank_loss_tokens of a batch (pl_batch). */
static void loss_tokens(pl__build_ctx *x, const pl_plan *plan,
                            int64_t dp_rank, pl_batch *b) {
    int64_t step = 0, rank = 0;
    if (x->step_loss) { /* a package: the whole step's count travels with it */
        for (int64_t s = 0; s < x->n_step_loss && step >= 0; s++) {
            int64_t v[2];
            memcpy(v, (const unsigned char *)x->step_loss + 16 * (size_t)s, 16);
            if (v[0] == 0) continue;
            pl_chunk probe = {0};
            probe.source = (int32_t)s;
            probe.length = 1;
            step = chunk_loss_tokens(x, &probe) < 0 ? -1 : step + v[1];
        }
    } else if (x->lt_plan == plan && x->lt_step == plan->step && x->lt_chunks == plan->n_chunks &&
        x->lt_tokens == plan->tokens) {
        step = x->lt_total; /* the same step's plan: counted already */
    } else {
        for (int64_t j = 0; j < plan->n_chunks && step >= 0; j++) {
            int64_t t = chunk_loss_tokens(x, &plan->chunks[j]);
            step = t < 0 ? -1 : step + t;
        }
        x->lt_plan = plan;
        x->lt_step = plan->step;
        x->lt_chunks = plan->n_chunks;
        x->lt_tokens = plan->tokens;
        x->lt_total = step;
    }
    const int64_t per = plan->micro_batches_per_rank * plan->micro_batch_size;
    for (int64_t i = 0; i < per && step >= 0; i++) {
        int64_t q = plan->rank_sequences[dp_rank * per + i];
        for (int64_t j = plan->seq_offsets[q]; j < plan->seq_offsets[q + 1]; j++)
            rank += chunk_loss_tokens(x, &plan->chunks[j]);
    }
    b->step_loss_tokens = step;
    b->rank_loss_tokens = step < 0 ? -1 : rank;
}

int pl__construct(pl__build_ctx *x, const pl_plan *plan, int64_t dp_rank,
                  int64_t mb, pl__batchbuf *buf) {
    pl_batch *b = &buf->b;
    const int64_t rows = plan->micro_batch_size, cols = x->cols;
    const int64_t S = x->full_cols, cp = x->cp, cpr = x->cp_rank;
    const size_t es = pl_dtype_size(x->dtype);
    b->step = plan->step;
    b->micro_batch = mb;
    b->dp_rank = dp_rank;
    b->rows = rows;
    b->cols = cols;
    b->dtype = x->dtype;
    b->fields = PL_FIELD_ALL;
    b->tokens = 0;
    b->n_chunks = 0;
    b->max_seqlen = 0;
    int64_t ncu = 0;
    b->cu_seqlens[ncu++] = 0;
    int64_t base = 0; /* flattened offset of the row */
    int64_t ordinal = 0; /* chunks read so far, in pl_plan_reads order */
    for (int64_t row = 0; row < rows; row++) {
        int64_t q = plan->rank_sequences[(dp_rank * plan->micro_batches_per_rank +
                                          mb) * rows + row];
        const pl_chunk *cs = plan->chunks + plan->seq_offsets[q];
        int64_t nc = plan->seq_offsets[q + 1] - plan->seq_offsets[q];
        b->n_chunks += nc;
        unsigned char *ids, *lab;
        float *mask;
        int64_t *pos, *seg = x->seg, *real = x->seg + S + 1;
        if (cp == 1) {
            ids = (unsigned char *)b->input_ids + (size_t)base * es;
            lab = (unsigned char *)b->labels + (size_t)base * es;
            mask = b->loss_mask + base;
            pos = b->position_ids + base;
        } else {
            unsigned char *s = buf->scratch;
            pos = (int64_t *)s;
            mask = (float *)(pos + S);
            ids = (unsigned char *)(mask + S);
            lab = ids + (size_t)S * es;
        }
        int64_t nseg = 0;
        int rc = x->dtype == PL_DTYPE_INT32
                     ? pl__row32(x, cs, nc, &ordinal, (int32_t *)ids, (int32_t *)lab, mask,
                                 pos, seg, &nseg, real)
                     : pl__row64(x, cs, nc, &ordinal, (int64_t *)ids, (int64_t *)lab, mask,
                                 pos, seg, &nseg, real);
        if (rc) return rc;
        if (cp == 1) {
            for (int64_t k = 0; k < nseg; k++) {
                b->tokens += real[k];
                b->segment_sources[ncu - 1] = k < nc ? cs[k].source : -1;
                b->cu_seqlens[ncu] = (int32_t)(b->cu_seqlens[ncu - 1] + seg[k]);
                ncu++;
                if (seg[k] > b->max_seqlen) b->max_seqlen = seg[k];
            }
        } else {
            /* Keep pieces cpr and 2cp-1-cpr of every segment. */
            int64_t src_off = 0, dst = base;
            for (int64_t k = 0; k < nseg; k++) {
                int64_t piece = seg[k] / (2 * cp);
                int64_t starts[2] = {src_off + cpr * piece,
                                     src_off + (2 * cp - 1 - cpr) * piece};
                for (int h = 0; h < 2; h++) {
                    int64_t in = real[k] - (starts[h] - src_off);
                    b->tokens += in < 0 ? 0 : (in > piece ? piece : in);
                    memcpy((unsigned char *)b->input_ids + (size_t)dst * es,
                           ids + (size_t)starts[h] * es, (size_t)piece * es);
                    memcpy((unsigned char *)b->labels + (size_t)dst * es,
                           lab + (size_t)starts[h] * es, (size_t)piece * es);
                    memcpy(b->loss_mask + dst, mask + starts[h],
                           (size_t)piece * sizeof(float));
                    memcpy(b->position_ids + dst, pos + starts[h],
                           (size_t)piece * sizeof(int64_t));
                    dst += piece;
                }
                b->segment_sources[ncu - 1] = k < nc ? cs[k].source : -1;
                b->cu_seqlens[ncu] = (int32_t)(b->cu_seqlens[ncu - 1] + 2 * piece);
                ncu++;
                if (2 * piece > b->max_seqlen) b->max_seqlen = 2 * piece;
                src_off += seg[k];
            }
        }
        base += cols;
    }
    b->n_cu_seqlens = ncu;
    loss_tokens(x, plan, dp_rank, b);
    b->n_images = b->n_patches = b->visual_tokens = 0;
    return x->has_images ? pl__construct_images(x, plan, dp_rank, mb, buf) : PL_OK;
}

/* ------------------------------------------------------------ readers */

int pl__build_ctx_init(pl__build_ctx *x, const pl_config *c,
                       pl__chunk_reader read, char *err, size_t errcap) {
    const int64_t cp = c->topology.cp;
    x->read = read;
    x->dtype = c->dtype;
    x->pad_id = c->pad_id;
    x->full_cols = pl__row_tokens(c);
    x->cols = pl__row_tokens(c) / cp;
    x->cp = cp;
    x->align = cp > 1 ? 2 * cp : 1;
    x->err = err;
    x->errcap = errcap;
    x->cfg = c;
    x->has_images = 0;
    x->has_sft = 0;
    x->lt_plan = NULL;
    x->step_loss = NULL;
    x->n_step_loss = 0;
    for (int64_t i = 0; i < c->n_sources; i++) {
        x->has_images |= pl__type_has_images(c->sources[i].type);
        x->has_sft |= pl__sx(&c->sources[i])->prompt_key != NULL || pl__sx(&c->sources[i])->messages_key != NULL;
    }
    x->seg = pl__calloc(2 * ((size_t)pl__row_tokens(c) + 1), sizeof(int64_t));
    return x->seg ? PL_OK : PL_ENOMEM;
}

int pl__read_from_sources(pl__build_ctx *x, int64_t ordinal, const pl_chunk *c,
                          void *ids, void *next, pl_dtype dt) {
    (void)ordinal;
    pl_source *src = x->sources[c->source];
    int rc = pl__source_read(src, c->index, c->offset, c->length, ids, dt,
                             x->err, x->errcap);
    if (rc || !next) return rc;
    return pl__source_read(src, c->index, c->offset + c->length, 1, next, dt,
                           x->err, x->errcap);
}

/* Payload j holds the tokens of read j (int64), see pl_plan_reads. */
static int read_from_payloads(pl__build_ctx *x, int64_t ordinal,
                                  const pl_chunk *c, void *ids, void *next,
                                  pl_dtype dt) {
    if (ordinal >= x->n_payloads) {
        pl__fmt(x->err, x->errcap,
                "constructor: %lld payloads given, chunk %lld needs one more",
                (long long)x->n_payloads, (long long)ordinal);
        return PL_EINVAL;
    }
    const int64_t *src = x->payloads[ordinal];
    const int64_t L = c->length, need = L + (next ? 1 : 0);
    if (x->payload_lengths[ordinal] < need) {
        pl__fmt(x->err, x->errcap,
                "constructor: payload %lld holds %lld tokens, its read needs %lld",
                (long long)ordinal, (long long)x->payload_lengths[ordinal],
                (long long)need);
        return PL_EINVAL;
    }
    if (dt == PL_DTYPE_INT32) {
        int32_t *d = ids;
        for (int64_t t = 0; t < L; t++) d[t] = (int32_t)src[t];
        if (next) *(int32_t *)next = (int32_t)src[L];
    } else {
        memcpy(ids, src, (size_t)L * sizeof(int64_t));
        if (next) *(int64_t *)next = src[L];
    }
    return PL_OK;
}

/* ------------------------------------------------------------ constructor */

struct pl_constructor {
    char errmsg[PL__ERRMSG_CAP];
    pl_config *cfg;
    pl__pool *pool;
    pl__build_ctx ctx;
};

static int constructor_create_impl(const pl_config *cfg, pl_constructor **out) {
    *out = NULL;
    pl_constructor *k = pl__calloc(1, sizeof *k);
    if (!k) return PL_ENOMEM;
    *out = k;
    k->cfg = pl__config_share(cfg);
    if (!k->cfg) goto oom;
    const pl_config *c = k->cfg;
    int64_t cp = c->topology.cp;
    if (pl__pool_create(pl__mb_rows(c), pl__row_tokens(c) / cp, pl__row_tokens(c),
                        c->dtype, &k->pool))
        goto oom;
    if (pl__build_ctx_init(&k->ctx, c, read_from_payloads, k->errmsg,
                           sizeof k->errmsg))
        goto oom;
    return PL_OK;
oom:
    pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: out of memory");
    return PL_ENOMEM;
}

void pl_constructor_free(pl_constructor *k) {
    if (!k) return;
    pl__pool_release_owner(k->pool);
    free(k->ctx.seg);
    pl_config_free(k->cfg);
    free(k);
}

const char *pl_constructor_errmsg(const pl_constructor *k) {
    return k ? k->errmsg : "out of memory";
}

static int constructor_build_impl(pl_constructor *k, const pl_plan *plan, int64_t rank,
                         int64_t mb, const int64_t *const *payloads,
                         const int64_t *payload_lengths, int64_t n_payloads,
                         pl_batch **out) {
    *out = NULL;
    if (!plan) {
        pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: NULL plan");
        return PL_EINVAL;
    }
    pl_rank_info ri;
    int rc = pl_config_rank_info(k->cfg, rank, &ri);
    if (rc) {
        pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: rank %lld out of range",
                (long long)rank);
        return rc;
    }
    if (plan->dp != k->cfg->topology.dp || plan->seq_length != pl__row_tokens(k->cfg) ||
        plan->micro_batch_size != pl__mb_rows(k->cfg)) {
        pl__fmt(k->errmsg, sizeof k->errmsg,
                "constructor: the plan's dp/seq_length/micro_batch_size differ "
                "from the config's");
        return PL_EINVAL;
    }
    if (mb < 0 || mb >= plan->micro_batches_per_rank) {
        pl__fmt(k->errmsg, sizeof k->errmsg,
                "constructor: micro-batch %lld out of range [0, %lld)",
                (long long)mb, (long long)plan->micro_batches_per_rank);
        return PL_ERANGE;
    }
    /* A plan may come from another process: check what the build indexes. */
    if ((rc = pl__plan_check_rows(plan, ri.dp_rank, mb, k->errmsg, sizeof k->errmsg)))
        return rc;
    for (int64_t row = 0; row < plan->micro_batch_size; row++) {
        int64_t q = plan->rank_sequences[(ri.dp_rank * plan->micro_batches_per_rank +
                                          mb) * plan->micro_batch_size + row];
        int64_t t = 0;
        for (int64_t j = plan->seq_offsets[q]; j < plan->seq_offsets[q + 1]; j++) {
            const pl_chunk *c = &plan->chunks[j];
            if (c->source < 0 || c->source >= k->cfg->n_sources || c->length <= 0 ||
                c->length > plan->seq_length) {
                pl__fmt(k->errmsg, sizeof k->errmsg,
                        "constructor: chunk %lld of the plan names source %d "
                        "with length %lld",
                        (long long)j, c->source, (long long)c->length);
                return PL_EINVAL;
            }
            t += (c->length + k->ctx.align - 1) / k->ctx.align * k->ctx.align;
            if (t > plan->seq_length) break; /* the sum cannot overflow */
        }
        if (t > plan->seq_length) {
            pl__fmt(k->errmsg, sizeof k->errmsg,
                    "constructor: sequence %lld of the plan holds %lld tokens, "
                    "more than seq_length %lld",
                    (long long)q, (long long)t, (long long)plan->seq_length);
            return PL_EINVAL;
        }
    }
    if (n_payloads > 0 && (!payloads || !payload_lengths)) {
        pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: NULL payloads");
        return PL_EINVAL;
    }
    pl__batchbuf *buf = NULL;
    if ((rc = pl__pool_get(k->pool, &buf))) {
        pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: out of memory");
        return rc;
    }
    k->ctx.payloads = payloads;
    k->ctx.payload_lengths = payload_lengths;
    k->ctx.n_payloads = n_payloads;
    k->ctx.cp_rank = ri.cp_rank;
    rc = pl__construct(&k->ctx, plan, ri.dp_rank, mb, buf);
    if (!rc) rc = pl__view_create(buf, ri.fields, out);
    pl__buf_release(buf); /* the view holds its own reference */
    if (rc == PL_ENOMEM) pl__fmt(k->errmsg, sizeof k->errmsg, "constructor: out of memory");
    return rc;
}

/* ------------------------------------------------ per-thread messages */

int pl_constructor_create(const pl_config *cfg, pl_constructor **out) {
    int rc = constructor_create_impl(cfg, out);
    if (rc < 0) pl__thread_err(*out ? pl_constructor_errmsg(*out) : "constructor: out of memory");
    return rc;
}

int pl_constructor_build(pl_constructor *k, const pl_plan *plan, int64_t rank, int64_t micro_batch,
                         const int64_t *const *payloads, const int64_t *payload_lengths,
                         int64_t n_payloads, pl_batch **out) {
    int rc = constructor_build_impl(k, plan, rank, micro_batch, payloads, payload_lengths, n_payloads, out);
    if (rc < 0) pl__thread_err(pl_constructor_errmsg(k));
    return rc;
}
