/*
 * build/build.h -- internal interface of the data constructor
 * (constructor.c, images.c) and of the batch buffer pool, used by the
 * loader and the pipeline.
 */
#ifndef POLYLOAD_CONSTRUCTOR_H
#define POLYLOAD_CONSTRUCTOR_H

#include "planner/planner.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct pl__pool pl__pool;

/* A micro-batch's memory; reference counted, recycled through its pool. */
typedef struct pl__batchbuf {
    pl_batch b;        /* all fields present */
    atomic_long refs;
    pl__pool *pool;
    struct pl__batchbuf *next_free;
    int64_t cu_cap;
    void *scratch;     /* CP only: one full row of every field */
    size_t pix_cap;    /* bytes of b.pixel_values */
    int64_t img_cap;   /* images b.image_grid_thw / image_positions hold */
} pl__batchbuf;

int pl__pool_create(int64_t rows, int64_t cols, int64_t full_cols,
                    pl_dtype dtype, pl__pool **out);
/* The owner lets go; the pool lives on until its last buffer returns. */
void pl__pool_release_owner(pl__pool *p);
int pl__pool_get(pl__pool *p, pl__batchbuf **out);
void pl__buf_retain(pl__batchbuf *b);
void pl__buf_release(pl__batchbuf *b);

/* A per-rank view of a buffer (fields the rank does not receive are NULL). */
int pl__view_create(pl__batchbuf *buf, uint32_t fields, pl_batch **out);

/* What one builder thread needs to build micro-batches. */
typedef struct pl__build_ctx pl__build_ctx;
/* Read chunk number `ordinal` of the micro-batch (c->length tokens into ids,
 * and the token after it into *next unless next is NULL). */
typedef int (*pl__chunk_reader)(pl__build_ctx *x, int64_t ordinal,
                                const pl_chunk *c, void *ids, void *next,
                                pl_dtype dt);
struct pl__build_ctx {
    pl__chunk_reader read;
    const int64_t *const *payloads; /* payload reader */
    const int64_t *payload_lengths;
    int64_t n_payloads;
    const pl_payload *typed;        /* typed payload reader (packages) */
    int64_t n_typed;
    const pl_payload_image *images; /* packages: the step's images */
    const int64_t *image_of;        /* [n_typed]: image of each read, -1 */
    pl_source *const *sources;
    pl_dtype dtype;
    int64_t pad_id;
    int64_t full_cols;  /* seq_length */
    int64_t cols;       /* seq_length / cp */
    int64_t cp, cp_rank;
    int64_t align;      /* 2*cp if cp > 1 else 1 */
    int64_t *seg;       /* scratch [2 * (seq_length + 1)]: segment lengths
                           padded, then unpadded */
    const pl_config *cfg; /* borrowed from the owner */
    int has_images;       /* some source is a webdataset */
    int has_sft;          /* some source is instruction data (prompt_key) */
    /* The step's loss tokens (pl_batch.step_loss_tokens) of the plan last
       built from, kept per step: a sum over the whole step's chunks. */
    const pl_plan *lt_plan;
    int64_t lt_step, lt_chunks, lt_tokens, lt_total;
    /* A package's count of the whole step (its plan holds one DP rank's
       chunks): {chunks, loss tokens} per source, unaligned; NULL: count
       the plan. */
    const void *step_loss;
    int64_t n_step_loss;
    char *err;
    size_t errcap;
};

/* Fill x for cfg (allocates x->seg; the owner frees it). */
int pl__build_ctx_init(pl__build_ctx *x, const pl_config *cfg,
                       pl__chunk_reader read, char *err, size_t errcap);

/* The reader of the embedded loader: straight from the sources. */
int pl__read_from_sources(pl__build_ctx *x, int64_t ordinal, const pl_chunk *c,
                          void *ids, void *next, pl_dtype dt);

/* The images of micro-batch `mb` (build/images.c): pixel_values,
 * image_grid_thw, image_positions of buf, and labels/loss_mask masked on
 * image placeholder tokens.  Called by pl__construct after the rows. */
int pl__construct_images(pl__build_ctx *x, const pl_plan *plan, int64_t dp_rank,
                         int64_t mb, pl__batchbuf *buf);

/* Build micro-batch `mb` of `dp_rank` (for x->cp_rank) into buf. */
int pl__construct(pl__build_ctx *x, const pl_plan *plan, int64_t dp_rank,
                  int64_t mb, pl__batchbuf *buf);

#endif
