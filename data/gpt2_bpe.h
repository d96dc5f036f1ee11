// gpt2_bpe: GPT-2's byte-level BPE in C. Reads OpenAI's encoder.json and vocab.bpe,
// pre-tokenizes with GPT-2's regex through PCRE2 and applies the merges; matches tiktoken's
// "gpt2" encoding token for token. <|endoftext|> is 50256.
#pragma once
#include <stddef.h>

typedef struct Gpt2Bpe Gpt2Bpe;   // opaque

#define GPT2_EOT 50256

// Returns NULL with err naming the file and the problem (missing, malformed, inconsistent).
// Any vocabulary laid out like GPT-2's loads: the 256 byte tokens in GPT-2's order, then one
// token per line of vocab.bpe in that order, then <|endoftext|> last.
Gpt2Bpe *gpt2_bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen);
// gpt2_bpe_load of the two files' bytes already in memory (the names appear in messages).
Gpt2Bpe *gpt2_bpe_load_buffers(const char *encoder, size_t encoder_len, const char *encoder_name,
                               const char *merges, size_t merges_len, const char *merges_name,
                               char *err, size_t errlen);
// gpt2_bpe_load with defaults: a NULL path is $FLASHGPT_GPT2_DIR/<name> when that variable is
// set, else data_cache/gpt2/<name> (scripts/fetch_data.sh); on failure err says how to get them.
Gpt2Bpe *gpt2_bpe_load_default(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen);
void gpt2_bpe_free(Gpt2Bpe *t);
int gpt2_bpe_vocab_size(const Gpt2Bpe *t);   // 50257
// The id of <|endoftext|>: the last one, 50256 for GPT-2's files.
int gpt2_bpe_eot(const Gpt2Bpe *t);
// Encodes len bytes of text (special tokens are NOT recognised in the text); appends ids to
// *ids (capacity *cap, grown with realloc) at *n. Returns 0, or -1 with err saying what failed:
// no memory, or a PCRE2 error in the pre-tokenizer (neither is a property of the text; the ids
// appended so far stay in *ids for the caller to free).
// Invalid UTF-8 is read as Python's bytes.decode('utf-8', errors='replace') reads it: each
// maximal invalid subsequence becomes U+FFFD (bytes EF BF BD), so the ids equal tiktoken's
// encode_ordinary(data.decode('utf-8', 'replace')) for ANY bytes, and decoding them gives the
// replaced text, not the original bytes. Valid UTF-8 round-trips exactly.
int gpt2_bpe_encode(const Gpt2Bpe *t, const char *text, size_t len, int **ids, size_t *n, size_t *cap,
                    char *err, size_t errlen);
// The same ids as gpt2_bpe_encode, computed by n_threads OpenMP threads (<= 0: all of them) on
// chunks cut just after newlines where the pre-tokenizer always splits; small inputs run on one
// thread. Errors as gpt2_bpe_encode.
int gpt2_bpe_encode_parallel(const Gpt2Bpe *t, const char *text, size_t len, int n_threads,
                             int **ids, size_t *n, size_t *cap, char *err, size_t errlen);
// llm.c's document convention, in parallel: text is split after every occurrence of sep (not
// empty; it stays at the end of the document it closes; like Python's text.split(sep), a text
// that ends with sep ends with an empty document), and each document is encoded on its own
// after one <|endoftext|>. Threads share out whole documents, and cut long ones as above.
// Errors as gpt2_bpe_encode.
int gpt2_bpe_encode_documents(const Gpt2Bpe *t, const char *text, size_t len, const char *sep,
                              int n_threads, int **ids, size_t *n, size_t *cap, char *err,
                              size_t errlen);
// The bytes of token id, *len set; NULL for an out-of-range id.
const unsigned char *gpt2_bpe_token_bytes(const Gpt2Bpe *t, int id, int *len);
