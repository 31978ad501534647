/*
 * source/tokenizer/spm.cc -- SentencePiece (the C++ library, Debian libsentencepiece-dev)
 * as a pl_tokenizer: config `tokenizer: {type: sentencepiece, path: MODEL}`.
 *
 * The only C++ file of the library, behind a C interface (pl__spm_create); built
 * when CMake finds the library (PL_WITH_SENTENCEPIECE).  Each text is encoded
 * with SentencePieceProcessor::Encode into ids, which is const and safe to call
 * from several threads at once.  No exception leaves this file.
 */
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

extern "C" {
#include "source/tokenizer/tokenizer.h"
}

namespace {

struct Spm {
    sentencepiece::SentencePieceProcessor sp;
    std::string name;
};

int spm_encode(void *ctx, int64_t n, const char *const *texts, const size_t *lens,
               int32_t **ids, int64_t *counts, char *err, size_t errcap) {
    const Spm *h = static_cast<const Spm *>(ctx);
    int64_t done = 0;
    try {
        std::vector<int> v;
        for (; done < n; done++) {
            v.clear();
            auto st = h->sp.Encode(absl::string_view(texts[done], lens[done]), &v);
            if (!st.ok()) {
                pl__fmt(err, errcap, "%s", st.ToString().c_str());
                break;
            }
            ids[done] = nullptr;
            counts[done] = static_cast<int64_t>(v.size());
            if (v.empty()) continue;
            ids[done] = static_cast<int32_t *>(pl__realloc_array(nullptr, v.size(), sizeof(int32_t)));
            if (!ids[done]) {
                pl__fmt(err, errcap, "out of memory");
                break;
            }
            for (size_t j = 0; j < v.size(); j++) ids[done][j] = v[j];
        }
    } catch (const std::exception &e) {
        pl__fmt(err, errcap, "%s", e.what());
    }
    if (done == n) return PL_OK;
    for (int64_t i = 0; i < done; i++) std::free(ids[i]);
    return PL_EINVAL;
}

void spm_destroy(void *ctx) { delete static_cast<Spm *>(ctx); }

} // namespace

extern "C" int pl__spm_create(const char *path, pl_tokenizer *out, char *err,
                              size_t errcap) {
    Spm *h = new (std::nothrow) Spm;
    if (!h) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    try {
        auto st = h->sp.Load(path);
        if (!st.ok()) {
            pl__fmt(err, errcap, "%s: cannot load SentencePiece model: %s", path,
                    st.ToString().c_str());
            delete h;
            return PL_ECONFIG;
        }
        h->name = std::string("sentencepiece:") + path;
        std::memset(out, 0, sizeof *out);
        out->version = PL_TOKENIZER_VERSION;
        out->ctx = h;
        out->encode_batch = spm_encode;
        out->destroy = spm_destroy;
        out->eos_id = h->sp.eos_id();
        out->vocab_size = h->sp.GetPieceSize();
        out->name = h->name.c_str();
    } catch (const std::exception &e) {
        pl__fmt(err, errcap, "%s: %s", path, e.what());
        delete h;
        return PL_ECONFIG;
    }
    return PL_OK;
}
