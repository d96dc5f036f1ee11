// passkey: prompts of the passkey retrieval test and their greedy scoring (trainer/passkey.h).
#include "trainer/passkey.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/generate.h"

int passkey_draw_key(Rng *r) {
    return 10000 + (int)rng_below(r, 90000);
}

void passkey_key_texts(int key, char *needle, size_t needle_len, char *answer, size_t answer_len) {
    snprintf(needle, needle_len, PASSKEY_NEEDLE_FMT, key, key);
    snprintf(answer, answer_len, PASSKEY_ANSWER_FMT, key);
}

int passkey_min_length(const PasskeyPieces *p) {
    return p->intro.n + p->needle.n + p->question.n + p->answer.n;
}

int passkey_layout(const PasskeyPieces *p, int length, double depth, PasskeyLayout *l, char *err,
                   size_t errlen) {
    const int need = passkey_min_length(p);
    if (length < need)
        return set_error(err, errlen, "a passkey sequence of %d tokens cannot hold the prompt: it needs "
                         "at least %d tokens with this tokenizer", length, need);
    l->length = length;
    l->prompt_len = length - p->answer.n;
    l->filler = length - need;
    l->needle_at = p->intro.n + (int)floor(depth * l->filler + 0.5);
    return 0;
}

static int *put(int *dst, const TokenRun *r) {
    memcpy(dst, r->ids, (size_t)r->n * sizeof(int));
    return dst + r->n;
}

void passkey_build(const PasskeyPieces *p, const PasskeyLayout *l, int *seq) {
    int *w = put(seq, &p->intro);
    const int before = l->needle_at - p->intro.n;   // filler tokens before the needle
    for (int f = 0; f < l->filler; f++) {
        if (f == before) w = put(w, &p->needle);
        *w++ = p->filler.ids[f % p->filler.n];
    }
    if (before == l->filler) w = put(w, &p->needle);
    w = put(w, &p->question);
    put(w, &p->answer);
}

int passkey_recalled(GPT *m, const int *seq, const PasskeyLayout *l, int n_answer) {
    int *got = xmalloc((size_t)n_answer * sizeof(int));
    Rng unused;   // greedy decoding draws nothing
    rng_seed(&unused, 0);
    const int n = gpt_generate(m, seq, l->prompt_len, n_answer, 0.0f, 0, &unused, got);
    const int ok = n == n_answer && memcmp(got, seq + l->prompt_len, (size_t)n * sizeof(int)) == 0;
    free(got);
    return ok;
}
