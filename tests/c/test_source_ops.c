/*
 * The formats' method tables (source/source.h): every format of
 * PL__SOURCE_FORMATS has a well-formed table of the current version, one
 * per source type, and a source of several files of one format numbers and
 * reads them through its table and its file records (ops->file_size apart).
 */
#include "fixtures.h"
#include "source/source.h"
#include "testutil.h"

#define PL__T_REF(n) &pl__##n##_ops,
static const pl__source_ops *const formats[] = {PL__SOURCE_FORMATS(PL__T_REF)};
#undef PL__T_REF
#define NFORMATS (sizeof formats / sizeof formats[0])

static void test_tables(void) {
    int seen[16] = {0};
    for (size_t i = 0; i < NFORMATS; i++) {
        const pl__source_ops *o = formats[i];
        CHECK_EQ_I64(o->version, PL__SOURCE_OPS_VERSION);
        CHECK(o->name && o->name[0]);
        CHECK(o->unit && o->unit[0]);
        CHECK(o->data_suffix && o->index_suffix);
        CHECK(o->file_size >= sizeof(pl__sfile));
        CHECK(o->init && o->open_file && o->doc);
        CHECK((o->image_info == NULL) == (o->read_image == NULL));
        if (o->flags & PL__SRC_LAZY)
            CHECK(o->read && o->record && o->lengths && o->lookahead && o->setup &&
                  o->free && o->stats);
        else
            CHECK(!o->record && !o->lookahead);
        CHECK(o->type >= PL_SOURCE_MEGATRON && o->type <= PL_SOURCE_PARQUET);
        /* The table's name is the type's name in PL_SOURCE_TYPE_MAP (configs,
           the CLI, messages): the two lists cannot disagree. */
        const char *tn = pl_source_type_name(o->type);
        CHECK(tn && strcmp(o->name, tn) == 0);
        if (o->type >= 1 && o->type < 16) seen[o->type]++;
    }
    /* One table per source type, every type covered. */
    for (int t = PL_SOURCE_MEGATRON; t <= PL_SOURCE_PARQUET; t++) CHECK_EQ_I64(seen[t], 1);
    CHECK_EQ_I64(pl__megatron_ops.type, PL_SOURCE_MEGATRON);
    CHECK(strcmp(pl__webdataset_ops.name, "webdataset") == 0);
    CHECK(pl__webdataset_ops.image_info != NULL);
    CHECK(pl__jsonl_ops.flags & PL__SRC_JSON);
    CHECK(!(pl__text_ops.flags & PL__SRC_JSON));
}

/* Three Megatron files in a directory: token k of file f is 1000 * f + k. */
static void test_files(void) {
    const char *dir = pl_test_tmpdir();
    static const int64_t lens[3][3] = {{5, 7, 0}, {3, 0, 0}, {4, 6, 2}};
    static const int64_t ndoc[3] = {2, 1, 3};
    char p[512];
    for (int f = 0; f < 3; f++) {
        snprintf(p, sizeof p, "%s/part%d", dir, f);
        if (plf_write_megatron(p, PL_DTYPE_UINT16, ndoc[f], lens[f], 1000 * f) != 0) exit(2);
    }
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = dir;
    pl_source *s = NULL;
    CHECK_OK(pl_source_open(&o, &s));
    if (!s) return;
    CHECK(s->ops == &pl__megatron_ops);
    CHECK_EQ_I64(s->file_size, pl__megatron_ops.file_size);
    CHECK_EQ_I64(pl_source_num_files(s), 3);
    CHECK_EQ_I64(pl_source_num_documents(s), 6);
    int64_t g = 0;
    for (int f = 0; f < 3; f++) {
        const pl__sfile *rec = pl__src_file(s, f);
        CHECK_EQ_I64(rec->first_doc, g);
        CHECK_EQ_I64(rec->n_docs, ndoc[f]);
        int64_t at = 0;
        for (int r = 0; r < ndoc[f]; r++, g++) {
            int64_t lr = -1, len = -1;
            CHECK(pl__source_locate(s, g, &lr) == rec);
            CHECK_EQ_I64(lr, r);
            CHECK_OK(pl_source_document_length(s, g, &len));
            CHECK_EQ_I64(len, lens[f][r]);
            int64_t out[8] = {0};
            CHECK_OK(pl_source_read(s, g, 0, len, out, PL_DTYPE_INT64));
            for (int k = 0; k < len; k++) CHECK_EQ_I64(out[k], 1000 * f + at + k);
            at += len;
        }
    }
    /* Not an image source: the image entries are absent. */
    pl_image_info info;
    CHECK_EQ_I64(pl_source_image_info(s, 0, &info), PL_EINVAL);
    CHECK(strstr(pl_source_errmsg(s), "not a webdataset source") != NULL);
    CHECK_EQ_I64(pl_source_num_tokenized(s), 0);
    CHECK_EQ_I64(pl_source_tokenizer_state(s, NULL, NULL), -1);
    pl_source_free(s);
}

/* A type no table claims is refused at open, naming the source. */
static void test_unknown_type(void) {
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = (pl_source_type)99;
    o.name = "odd";
    o.path = "/nonexistent";
    pl_source *s = NULL;
    CHECK_EQ_I64(pl_source_open(&o, &s), PL_EINVAL);
    CHECK(s && strstr(pl_source_errmsg(s), "source odd: unknown source type 99"));
    pl_source_free(s);
}

int main(void) {
    test_tables();
    test_files();
    test_unknown_type();
    TEST_END();
}
