/* libFuzzer target: the .plidx sidecar of a flat uint16 file.  The data file
 * is fixed (written once); the input is the sidecar.  When bit 0 of byte 20
 * (a reserved header byte) is set, the harness rewrites the header fields
 * that must match the data file (width, type, eos, size, mtime) and the
 * header CRC, so the fuzzer explores the offsets behind a valid header. */
#include "fuzz_common.h"

#include <sys/stat.h>

#define NTOK 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct stat st;
    static int ready;
    fz_enter_tmpdir();
    if (!ready) {
        int64_t tok[NTOK];
        for (int i = 0; i < NTOK; i++) tok[i] = (i * 7919) % 13 == 0 ? 0 : 1 + i % 500;
        if (plf_write_flat("flat.bin", PL_DTYPE_UINT16, tok, NTOK)) abort();
        if (stat("flat.bin", &st)) abort();
        ready = 1;
    }
    uint8_t *b = malloc(size ? size : 1);
    memcpy(b, data, size);
    if (size >= 64 && (b[20] & 1)) {
        uint32_t w = 2, type = PL_SOURCE_FLAT;
        uint64_t eos = 0, fsize = (uint64_t)st.st_size;
        int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
        memcpy(b + 12, &w, 4);
        memcpy(b + 16, &type, 4);
        memcpy(b + 24, &eos, 8);
        memcpy(b + 32, &fsize, 8);
        memcpy(b + 40, &mt, 8);
        uint32_t crc = pl__crc32(0, b, 60);
        memcpy(b + 60, &crc, 4);
    }
    fz_write("flat.bin.plidx", b, size);
    free(b);
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_FLAT;
    o.path = "flat.bin";
    o.eos_id = 0;
    pl_source *s = NULL;
    if (pl_source_open(&o, &s) == PL_OK) fz_walk_source(s);
    pl_source_free(s);
    return 0;
}
