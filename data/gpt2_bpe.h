// gpt2_bpe: GPT-2's byte-level BPE in C. Reads OpenAI's encoder.json and vocab.bpe,
// pre-tokenizes with GPT-2's regex through PCRE2 and applies the merges; matches tiktoken's
// "gpt2" encoding token for token. <|endoftext|> is 50256.
#pragma once
#include <stddef.h>

typedef struct Gpt2Bpe Gpt2Bpe;   // opaque

#define GPT2_EOT 50256

// Returns NULL with err naming the file and the problem (missing, malformed, inconsistent).
Gpt2Bpe *gpt2_bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen);
void gpt2_bpe_free(Gpt2Bpe *t);
int gpt2_bpe_vocab_size(const Gpt2Bpe *t);   // 50257
// Encodes len bytes of text (special tokens are NOT recognised in the text); appends ids to
// *ids (capacity *cap, grown with realloc) at *n. Returns 0.
int gpt2_bpe_encode(const Gpt2Bpe *t, const char *text, size_t len, int **ids, size_t *n, size_t *cap);
// The bytes of token id, *len set; NULL for an out-of-range id.
const unsigned char *gpt2_bpe_token_bytes(const Gpt2Bpe *t, int id, int *len);
