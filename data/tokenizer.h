// tokenizer: llm.c's tokenizer file (magic 20240328, version 2: header of 256 uint32 with
// n_tokens and the end-of-text id, then per token a length byte and its bytes), used to decode
// samples; and the char and byte tokenizers that `train_gpt prepare` builds.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define TOKENIZER_MAGIC 20240328   // header[0] of llm.c's tokenizer file

typedef struct Tokenizer Tokenizer;   // opaque

// Returns NULL with err naming the file and the problem.
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
// tokenizer_load of a file's bytes already in memory (path names it in messages).
Tokenizer *tokenizer_parse(const unsigned char *buf, size_t size, const char *path, char *err,
                           size_t errlen);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t);
int tokenizer_eot(const Tokenizer *t);           // -1 when there is none
// The bytes of token id (not NUL-terminated), *len set; NULL for an out-of-range id.
const unsigned char *tokenizer_decode(const Tokenizer *t, int id, int *len);
// Encodes text with a char/byte vocabulary (greedy single-token lookup): returns the number of
// ids written into ids (capacity cap), or -1 if some character is not in the vocabulary.
// Each id covers at least one byte, so cap = strlen(text) always suffices; with less it stops
// after cap ids. (Greedy longest match: for GPT-2 vocabularies use data/gpt2_bpe.h instead.)
long tokenizer_encode_simple(const Tokenizer *t, const char *text, int *ids, long cap);
// The same for len bytes of text that may contain NUL bytes (prepare's input files).
long tokenizer_encode_bytes(const Tokenizer *t, const char *text, size_t len, int *ids, long cap);

// Builders for `train_gpt prepare`. Vocabularies without an end-of-text token store eot
// 0xFFFFFFFF in the file, and tokenizer_eot returns -1 for them.
// Char: the sorted distinct Unicode code points of UTF-8 text (each token is the character's
// UTF-8 encoding), as nanoGPT's shakespeare_char. NULL with err (the byte offset) on invalid
// UTF-8 or empty text.
Tokenizer *tokenizer_build_char(const char *text, size_t len, char *err, size_t errlen);
Tokenizer *tokenizer_build_byte(void);   // the 256 byte values, token i = byte i
// A vocabulary from a table of n tokens (token i: lens[i] bytes at bytes[i], 1..255 bytes as
// llm.c requires) and an end-of-text id (-1: none), e.g. GPT-2's. NULL with err on a bad table.
Tokenizer *tokenizer_build_table(int n, const unsigned char *const *bytes, const int *lens, int eot,
                                 char *err, size_t errlen);
// Writes t in llm.c's format (version 2) through a temporary file and rename; 0 or -1 with err.
int tokenizer_save(const Tokenizer *t, const char *path, char *err, size_t errlen);
