/* libFuzzer target: a Megatron .idx.  Input: u32 size of the .bin (mod
 * 2^16; its bytes are a fixed pattern), then the .idx bytes. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_enter_tmpdir();
    if (size < 4) return 0;
    uint32_t bin;
    memcpy(&bin, data, 4);
    bin &= 0xffff;
    static uint8_t pattern[1 << 16];
    for (uint32_t i = 0; i < bin; i++) pattern[i] = (uint8_t)(i * 31 + 7);
    fz_write("m.bin", pattern, bin);
    fz_write("m.idx", data + 4, size - 4);
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = "m";
    pl_source *s = NULL;
    if (pl_source_open(&o, &s) == PL_OK) fz_walk_source(s);
    pl_source_free(s);
    return 0;
}
