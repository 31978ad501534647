/*
 * wire/wire.h -- internal view of a decoded package (package.c), used by the
 * loader's external mode.  Plans (plan.c) and replies (reply.c) have only
 * their public functions.
 */
#ifndef POLYLOAD_PACKAGE_H
#define POLYLOAD_PACKAGE_H

#include "planner/planner.h"

typedef struct pl__package {
    int64_t step, dp_rank;
    const void *state;   /* into buf */
    size_t state_len;
    pl_plan *plan;       /* owned: the DP rank's part of the step's plan */
    int64_t n_reads;
    pl_payload *reads;   /* [n_reads], data into buf (unaligned) */
    int64_t n_images;
    pl_payload_image *images; /* [n_images], data into buf */
    int64_t *image_of;   /* [n_reads]: index into images, -1 for none */
    int64_t *mb_first;   /* [nmb + 1]: first read of each micro-batch */
    /* The whole step's {chunks, loss tokens} by config source index (into
       buf, unaligned: [n_step_loss] pairs of i64). */
    const void *step_loss;
    int64_t n_step_loss;
    void *buf;           /* owned copy of the package */
} pl__package;

/* Check and copy a package; err receives the reason on failure. */
int pl__package_decode(const void *buf, size_t len, pl__package **out,
                       char *err, size_t errcap);
void pl__package_free(pl__package *k);

#endif
