/*
 * source/text/formats.c -- the method tables of the raw text formats read
 * from lines and files (jsonl, text; parquet.c holds Parquet's) and the
 * entries they share with Parquet.
 */
#include "source/text/text.h"

int pl__text_init_common(pl_source *src, const pl_source_options *opts,
                         int skip_damaged, char *err, size_t errcap) {
    (void)skip_damaged;
    /* The tokenizer's eos is the default (pl__text_init); no check here. */
    int rc = pl__source_init_common(src, opts, 0, 0, err, errcap);
    src->dtype = PL_DTYPE_INT32;
    return rc;
}

int pl__text_release_pages(pl_source *src, pl__sfile *f) {
    pl__tfile *tf = (pl__tfile *)f;
    return pl__release_map(src, f->path, tf->len_map, tf->len_map_len);
}

#define PL__TEXT_OPS_COMMON                                                   \
    .version = PL__SOURCE_OPS_VERSION, .file_size = sizeof(pl__tfile),        \
    .data_suffix = "", .index_suffix = ".plrec", .setup = pl__text_init,      \
    .init = pl__text_init_common, .open_file = pl__text_open_file,           \
    .start = pl__text_start, .close_file = pl__text_close_file,               \
    .free = pl__text_free, .doc = pl__text_doc, .read = pl__text_read,        \
    .record = pl__text_record, .lengths = pl__text_lengths,                   \
    .lookahead = pl__text_lookahead, .size_of = pl__text_sizeof,              \
    .release_pages = pl__text_release_pages, .stats = pl__text_stats,         \
    .release_tokenizer = pl__text_release_tokenizer,                          \
    .tokenizer_state = pl__text_tokenizer_state

/* JSON Lines: a record per line, a JSON object. */
const pl__source_ops pl__jsonl_ops = {
    PL__TEXT_OPS_COMMON,
    .type = PL_SOURCE_JSONL,
    .name = "jsonl",
    .flags = PL__SRC_LAZY | PL__SRC_JSON | PL__SRC_LINES,
    .unit = "line",
};

/* Plain text: a record per file. */
const pl__source_ops pl__text_ops = {
    PL__TEXT_OPS_COMMON,
    .type = PL_SOURCE_TEXT,
    .name = "text",
    .flags = PL__SRC_LAZY,
    .unit = "file",
};
