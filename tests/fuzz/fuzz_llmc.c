/* libFuzzer target: an llm.c shard (1024-byte header, then tokens), opened
 * with an in-memory document index. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_enter_tmpdir();
    fz_write("shard.bin", data, size);
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_LLMC;
    o.path = "shard.bin";
    o.eos_id = 7;
    o.write_index = -1;
    pl_source *s = NULL;
    if (pl_source_open(&o, &s) == PL_OK) fz_walk_source(s);
    pl_source_free(s);
    return 0;
}
