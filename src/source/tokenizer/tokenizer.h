/*
 * tokenizer.h -- the tokenizers of raw text sources: shared, releasable
 * wrappers (share.c) and the built-in SentencePiece (spm.cc).
 */
#ifndef POLYLOAD_TOKENIZER_H
#define POLYLOAD_TOKENIZER_H

#include "config/config.h"

/* SentencePiece (source/tokenizer/spm.cc; only with PL_WITH_SENTENCEPIECE). */
int pl__spm_create(const char *path, pl_tokenizer *out, char *err, size_t errcap);

/* Shared, releasable tokenizers (source/tokenizer/share.c).  pl__tokref_create: a
 * wrapper pl_tokenizer (owning its ctx) over the process's one loaded
 * tokenizer of (type, path, pat_str, encoding, backend, factory, file identity),
 * built now with fn/spec_fn (both NULL: built in); the strings are copied.
 * pl__tokref_release: drop the wrapper's reference (rebuilt by its next
 * encode_batch) and trim the heap; 1 if one was held, 0 if not, -1 for a
 * tokenizer that is no wrapper.  pl__tokref_state: 1 loaded, 0 released, -1
 * no wrapper; *builds: references taken so far, *shared_by: wrappers
 * holding the same loaded tokenizer (0 when released). */
int pl__tokref_create(int type, const char *path, const char *pat_str,
                      const char *encoding, const char *backend, pl_tokenizer_factory fn,
                      pl_tokenizer_spec_factory spec_fn, void *ctx, pl_tokenizer *out,
                      char *err, size_t errcap);
int pl__tokref_release(pl_tokenizer *tok);
int pl__tokref_state(const pl_tokenizer *tok, int64_t *builds, int64_t *shared_by);
/* Run fn(arg) on thread key % n of the tokenize pool (pl_set_tokenize_threads)
 * and wait, or here when there is no pool (or on a pool thread).
 * pl__tokref_key: the key of a tokenizer (its file's), as build uses. */
void pl__tokpool_run(uint64_t key, void (*fn)(void *), void *arg);
uint64_t pl__tokref_key(const pl_tokenizer *tok);
/* Tokenizers built by the wrappers so far in this process. */
int64_t pl__tokenizers_loaded(void);
/* Give free heap pages back to the system (glibc malloc_trim(0)): now, or
 * at most every 100 ms (called after each tokenized batch). */
void pl__heap_trim(void);
void pl__heap_trim_soon(void);

#endif
