// tokenizer: llm.c's tokenizer file (magic 20240328, version 2: header of 256 uint32 with
// n_tokens and the end-of-text id, then per token a length byte and its bytes), used to decode
// samples; and the char and byte tokenizers that `train_gpt prepare` builds.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;   // opaque

// Returns NULL with err naming the file and the problem.
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t);
int tokenizer_eot(const Tokenizer *t);           // -1 when there is none
// The bytes of token id (not NUL-terminated), *len set; NULL for an out-of-range id.
const unsigned char *tokenizer_decode(const Tokenizer *t, int id, int *len);
// Encodes text with a char/byte vocabulary (greedy single-token lookup): returns the number of
// ids written into ids (capacity cap), or -1 if some character is not in the vocabulary.
long tokenizer_encode_simple(const Tokenizer *t, const char *text, int *ids, long cap);
