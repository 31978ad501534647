/*
 * plan.c -- plans as bytes, so that a planner in one process can feed data
 * constructors in others.
 *
 * Layout (little-endian): "PLPN", u32 version, u64 total length; i64 step,
 * dp, global_batch_size, micro_batch_size, micro_batches_per_rank,
 * seq_length, n_sequences, n_chunks, tokens; f64 lower_bound; then the
 * arrays chunks[n_chunks] (pl_chunk, 32 bytes each), seq_offsets[n+1],
 * seq_tokens[n], seq_cost[n], rank_sequences[n], rank_cost[dp]; u32 CRC-32
 * of everything before it.
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

#define PL__PLAN_VERSION 1u
#define PL__PLAN_HEADER (4 + 4 + 8 + 9 * 8 + 8)

static size_t plan_size(const pl_plan *p) {
    size_t n = (size_t)p->n_sequences;
    return PL__PLAN_HEADER + (size_t)p->n_chunks * sizeof(pl_chunk) +
           (n + 1) * 8 + n * 8 * 3 + (size_t)p->dp * 8 + 4;
}

static int plan_encode_impl(const pl_plan *p, void *buf, size_t cap, size_t *len) {
    if (!p || !len) return PL_EINVAL;
    size_t total = plan_size(p);
    *len = total;
    if (!buf) return PL_OK;
    if (cap < total) return PL_EINVAL;
    unsigned char *b = buf, *w = b;
    uint32_t version = PL__PLAN_VERSION;
    uint64_t t64 = total;
    int64_t fields[9] = {p->step, p->dp, p->global_batch_size,
                         p->micro_batch_size, p->micro_batches_per_rank,
                         p->seq_length, p->n_sequences, p->n_chunks, p->tokens};
#define PL__PUT(src, n)             \
    do {                            \
        memcpy(w, (src), (size_t)(n)); \
        w += (n);                   \
    } while (0)
    PL__PUT("PLPN", 4);
    PL__PUT(&version, 4);
    PL__PUT(&t64, 8);
    PL__PUT(fields, sizeof fields);
    PL__PUT(&p->lower_bound, 8);
    size_t n = (size_t)p->n_sequences;
    PL__PUT(p->chunks, (size_t)p->n_chunks * sizeof(pl_chunk));
    PL__PUT(p->seq_offsets, (n + 1) * 8);
    PL__PUT(p->seq_tokens, n * 8);
    PL__PUT(p->seq_cost, n * 8);
    PL__PUT(p->rank_sequences, n * 8);
    PL__PUT(p->rank_cost, (size_t)p->dp * 8);
#undef PL__PUT
    uint32_t crc = pl__crc32(0, b, (size_t)(w - b));
    memcpy(w, &crc, 4);
    return PL_OK;
}

static int plan_decode_impl(const void *buf, size_t len, pl_plan **out) {
    *out = NULL;
    const unsigned char *b = buf;
    if (!b || len < PL__PLAN_HEADER + 4 || memcmp(b, "PLPN", 4) != 0) return PL_EINVAL;
    uint32_t version, crc;
    uint64_t total;
    memcpy(&version, b + 4, 4);
    memcpy(&total, b + 8, 8);
    if (version != PL__PLAN_VERSION || total != len) return PL_EINVAL;
    memcpy(&crc, b + len - 4, 4);
    if (crc != pl__crc32(0, b, len - 4)) return PL_EINVAL;
    int64_t f[9];
    memcpy(f, b + 16, sizeof f);
    pl_plan hdr = {0};
    hdr.step = f[0];
    hdr.dp = f[1];
    hdr.global_batch_size = f[2];
    hdr.micro_batch_size = f[3];
    hdr.micro_batches_per_rank = f[4];
    hdr.seq_length = f[5];
    hdr.n_sequences = f[6];
    hdr.n_chunks = f[7];
    hdr.tokens = f[8];
    if (hdr.dp <= 0 || hdr.n_sequences <= 0 || hdr.n_chunks < 0 ||
        hdr.micro_batch_size <= 0 || hdr.micro_batches_per_rank <= 0 ||
        hdr.seq_length <= 0 || hdr.seq_length > PL__MAX_SEQ_LENGTH ||
        hdr.dp > PL__MAX_SEQ_LENGTH || hdr.micro_batch_size > PL__MAX_SEQ_LENGTH ||
        hdr.n_sequences % hdr.dp != 0 ||
        hdr.n_sequences / hdr.dp % hdr.micro_batch_size != 0 ||
        hdr.n_sequences / hdr.dp / hdr.micro_batch_size != hdr.micro_batches_per_rank ||
        hdr.n_chunks > (int64_t)(len / sizeof(pl_chunk)) ||
        hdr.n_sequences > (int64_t)(len / 8) || hdr.dp > (int64_t)(len / 8) ||
        plan_size(&hdr) != len)
        return PL_EINVAL;
    pl__plan_impl *m = pl__calloc(1, sizeof *m);
    if (!m) return PL_ENOMEM;
    size_t n = (size_t)hdr.n_sequences;
    m->chunks = pl__calloc((size_t)hdr.n_chunks, sizeof(pl_chunk));
    m->seq_offsets = pl__calloc(n + 1, 8);
    m->seq_tokens = pl__calloc(n, 8);
    m->seq_cost = pl__calloc(n, 8);
    m->rank_sequences = pl__calloc(n, 8);
    m->rank_cost = pl__calloc((size_t)hdr.dp, 8);
    if (!m->chunks || !m->seq_offsets || !m->seq_tokens || !m->seq_cost ||
        !m->rank_sequences || !m->rank_cost) {
        pl_plan_free(&m->pub);
        return PL_ENOMEM;
    }
    const unsigned char *r = b + 16 + sizeof f;
    memcpy(&hdr.lower_bound, r, 8);
    r += 8;
    memcpy(m->chunks, r, (size_t)hdr.n_chunks * sizeof(pl_chunk));
    r += (size_t)hdr.n_chunks * sizeof(pl_chunk);
    memcpy(m->seq_offsets, r, (n + 1) * 8);
    r += (n + 1) * 8;
    memcpy(m->seq_tokens, r, n * 8);
    r += n * 8;
    memcpy(m->seq_cost, r, n * 8);
    r += n * 8;
    memcpy(m->rank_sequences, r, n * 8);
    r += n * 8;
    memcpy(m->rank_cost, r, (size_t)hdr.dp * 8);
    /* Validate what the constructor will index with. */
    int ok = m->seq_offsets[0] == 0 && m->seq_offsets[n] == hdr.n_chunks;
    for (size_t q = 0; ok && q < n; q++)
        ok = m->seq_offsets[q] <= m->seq_offsets[q + 1] &&
             m->rank_sequences[q] >= 0 && m->rank_sequences[q] < (int64_t)n;
    for (int64_t j = 0; ok && j < hdr.n_chunks; j++)
        ok = m->chunks[j].source >= 0 && m->chunks[j].length > 0 &&
             m->chunks[j].length <= hdr.seq_length && m->chunks[j].offset >= 0 &&
             m->chunks[j].offset <= PL__MAX_TOKEN_OFFSET && m->chunks[j].index >= 0;
    for (size_t q = 0; ok && q < n; q++) { /* a sequence fits its row */
        int64_t t = 0;
        for (int64_t j = m->seq_offsets[q];
             j < m->seq_offsets[q + 1] && t <= hdr.seq_length; j++)
            t += m->chunks[j].length; /* each <= seq_length: no overflow */
        ok = t <= hdr.seq_length;
    }
    if (!ok) {
        pl_plan_free(&m->pub);
        return PL_EINVAL;
    }
    hdr.chunks = m->chunks;
    hdr.seq_offsets = m->seq_offsets;
    hdr.seq_tokens = m->seq_tokens;
    hdr.seq_cost = m->seq_cost;
    hdr.rank_sequences = m->rank_sequences;
    hdr.rank_cost = m->rank_cost;
    m->pub = hdr;
    *out = &m->pub;
    return PL_OK;
}

/* ------------------------------------------------ per-thread messages */

int pl_plan_encode(const pl_plan *p, void *buf, size_t cap, size_t *len) {
    int rc = plan_encode_impl(p, buf, cap, len);
    if (rc == PL_EINVAL) {
        char err[PL__ERRMSG_CAP];
        if (!p || !len)
            pl__fmt(err, sizeof err, "pl_plan_encode: NULL plan or length");
        else
            pl__fmt(err, sizeof err, "pl_plan_encode: the plan needs %zu bytes, the buffer holds %zu",
                    *len, cap);
        pl__thread_err(err);
    }
    return rc;
}

int pl_plan_decode(const void *buf, size_t len, pl_plan **out) {
    int rc = plan_decode_impl(buf, len, out);
    if (rc) {
        char err[PL__ERRMSG_CAP];
        if (rc == PL_ENOMEM)
            pl__fmt(err, sizeof err, "pl_plan_decode: out of memory decoding %zu bytes", len);
        else
            pl__fmt(err, sizeof err, "pl_plan_decode: %zu bytes are not a valid plan", len);
        pl__thread_err(err);
    }
    return rc;
}
