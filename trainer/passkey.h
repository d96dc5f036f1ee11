// passkey: the passkey (needle-in-a-haystack) retrieval test of long-context evaluation. A
// random number (the pass key) is stated once at a chosen depth of filler text, the text ends
// with a question, and the model must answer with the number. The test is scored by greedy
// decoding: a trial is recalled when the model's greedy continuation of the prompt is the
// answer's tokens, token for token. Everything is built from token ids, so that the caller
// encodes the texts below with the run's tokenizer (char, byte or GPT-2) and the length and
// depth of every sequence are exact in tokens.
#pragma once
#include <stddef.h>

#include "common/rng.h"
#include "model/gpt.h"

#define PASSKEY_DIGITS 5   // keys are 10000 .. 99999
#define PASSKEY_INTRO "A pass key is hidden in this text. Find it and remember it.\n"
#define PASSKEY_FILLER "The grass is green. The sky is blue. The sun is warm. Here we go again.\n"
#define PASSKEY_NEEDLE_FMT "The pass key is %d. Remember it. %d is the pass key.\n"
#define PASSKEY_QUESTION "What is the pass key? The pass key is"
#define PASSKEY_ANSWER_FMT " %d"

// A key drawn uniformly from the PASSKEY_DIGITS-digit numbers.
int passkey_draw_key(Rng *r);
// The texts that carry key: the needle (PASSKEY_NEEDLE_FMT) and the answer (PASSKEY_ANSWER_FMT).
void passkey_key_texts(int key, char *needle, size_t needle_len, char *answer, size_t answer_len);

typedef struct {
    const int *ids;
    int n;
} TokenRun;

// The encoded pieces of one trial: intro, filler (n >= 1), needle, question, answer (n >= 1).
typedef struct {
    TokenRun intro, filler, needle, question, answer;
} PasskeyPieces;

// Where the pieces sit in a sequence of `length` tokens: the intro, then F = length - (intro +
// needle + question + answer) filler tokens (the filler's tokens again and again, cut after F)
// with the needle inserted after round(depth * F) of them, then the question, then the answer.
// The model reads the prompt, tokens [0, prompt_len), and must continue it with the answer.
typedef struct {
    int length, prompt_len;
    int filler;      // F
    int needle_at;   // index of the needle's first token: intro.n + round(depth * F)
} PasskeyLayout;

// The fewest tokens a sequence of these pieces needs (F = 0).
int passkey_min_length(const PasskeyPieces *p);
// The layout of a sequence of length tokens with the needle at depth (in [0, 1]). Returns 0, or
// -1 with err when length is shorter than passkey_min_length.
int passkey_layout(const PasskeyPieces *p, int length, double depth, PasskeyLayout *l, char *err,
                   size_t errlen);
// The l->length tokens of the sequence into seq.
void passkey_build(const PasskeyPieces *p, const PasskeyLayout *l, int *seq);
// Whether m, decoding greedily with its KV cache (one sequence, l->length at most the positions
// it holds: gpt_decode_reserve), continues seq's prompt with exactly its n_answer answer tokens.
int passkey_recalled(GPT *m, const int *seq, const PasskeyLayout *l, int n_answer);
