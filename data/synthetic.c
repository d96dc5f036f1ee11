#include "data/synthetic.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"

#define SYNTH_MAX_SYMBOLS 256   // copy alphabet and Markov states: small enough for a demo model
#define MARKOV_SUCCESSORS 4     // sparse rows: entropy at most ln 4 per token
#define RETRIEVAL_PAIRS 16      // key/value pairs per retrieval sequence (fewer for tiny alphabets)
// Power iteration stops when an L1 step is below this; the lazy chain's error in pi is then of
// the same order divided by its spectral gap, far below the 1e-12 promised for the floor.
#define MARKOV_PI_TOL 1e-15
#define MARKOV_PI_MAX_ITERS 1000000

typedef enum { TASK_COPY, TASK_MARKOV, TASK_RETRIEVAL } TaskKind;

struct Synthetic {
    TaskKind kind;
    int spread;        // retrieval_spread: the opening pairs start at a random offset
    int T, S;          // sequence length, alphabet size (ids in [0, S))
    int K;             // Markov successors per state; retrieval key/value pairs
    int *next;         // (S, K) successor ids
    double *cum;       // (S, K) cumulative transition probabilities, last = 1
    double *pi_cum;    // (S,) cumulative stationary distribution, last = 1
    double floor;
};

static double uniform_open(Rng *r) {   // (0, 1], so its log is finite
    return ((double)(rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// Index of the first cum[i] > u (u in [0, 1)); the last entry is 1, so it always exists.
static int search_cum(const double *cum, int n, double u) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cum[mid] > u) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static void markov_transitions(Synthetic *s, double *p, Rng *r) {   // p: (S, K)
    for (int i = 0; i < s->S; i++) {
        int *nx = s->next + (size_t)i * s->K;
        nx[0] = (i + 1) % s->S;   // the ring through every state makes the chain irreducible
        for (int k = 1; k < s->K; k++) {
            int cand, dup;
            do {
                cand = (int)rng_below(r, (uint64_t)s->S);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= nx[j] == cand;
            } while (dup);
            nx[k] = cand;
        }
        double sum = 0;   // Dirichlet(1, ..., 1) through normalised exponentials
        for (int k = 0; k < s->K; k++) sum += p[(size_t)i * s->K + k] = -log(uniform_open(r));
        double acc = 0;
        for (int k = 0; k < s->K; k++) {
            p[(size_t)i * s->K + k] /= sum;
            acc += p[(size_t)i * s->K + k];
            s->cum[(size_t)i * s->K + k] = acc;
        }
        s->cum[(size_t)i * s->K + s->K - 1] = 1.0;
    }
}

// Stationary distribution by power iteration on the lazy chain (I + P) / 2, which has the same
// pi and converges for every irreducible chain, periodic or not.
static void markov_stationary(const Synthetic *s, const double *p, double *pi) {
    double *nxt = xmalloc(sizeof(double) * s->S);
    for (int i = 0; i < s->S; i++) pi[i] = 1.0 / s->S;
    for (int it = 0; it < MARKOV_PI_MAX_ITERS; it++) {
        for (int i = 0; i < s->S; i++) nxt[i] = 0.5 * pi[i];
        for (int i = 0; i < s->S; i++)
            for (int k = 0; k < s->K; k++)
                nxt[s->next[(size_t)i * s->K + k]] += 0.5 * pi[i] * p[(size_t)i * s->K + k];
        double diff = 0, sum = 0;
        for (int i = 0; i < s->S; i++) {
            diff += fabs(nxt[i] - pi[i]);
            sum += nxt[i];
        }
        for (int i = 0; i < s->S; i++) pi[i] = nxt[i] / sum;
        if (diff < MARKOV_PI_TOL) break;
    }
    free(nxt);
}

static void markov_build(Synthetic *s, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed ^ 0x6d61726b6f76ull);   // "markov": the task depends on the seed alone
    double *p = xmalloc(sizeof(double) * s->S * s->K);   // (S, K)
    double *pi = xmalloc(sizeof(double) * s->S);         // (S,)
    markov_transitions(s, p, &r);
    markov_stationary(s, p, pi);
    double h = 0, acc = 0;
    for (int i = 0; i < s->S; i++) {
        double hi = 0;
        for (int k = 0; k < s->K; k++) {
            double q = p[(size_t)i * s->K + k];
            if (q > 0) hi -= q * log(q);
        }
        h += pi[i] * hi;
        acc += pi[i];
        s->pi_cum[i] = acc;
    }
    s->pi_cum[s->S - 1] = 1.0;
    s->floor = h;
    free(p);
    free(pi);
}

Synthetic *synthetic_create(const char *name, int vocab_size, int T, uint64_t seed, char *err,
                            size_t errlen) {
    TaskKind kind;
    if (strcmp(name, "copy") == 0) kind = TASK_COPY;
    else if (strcmp(name, "markov") == 0) kind = TASK_MARKOV;
    else if (strcmp(name, "retrieval") == 0 || strcmp(name, "retrieval_spread") == 0)
        kind = TASK_RETRIEVAL;
    else {
        set_error(err, errlen, "data.synthetic: unknown task '%s' (expected copy, markov, "
                               "retrieval or retrieval_spread)", name);
        return NULL;
    }
    if (kind == TASK_COPY && T < 2) {
        set_error(err, errlen, "data.synthetic=copy needs train.seq_len >= 2 (got %d): the second half "
                            "must repeat a non-empty first half", T);
        return NULL;
    }
    if (kind == TASK_RETRIEVAL && (vocab_size < 8 || T < 4 * RETRIEVAL_PAIRS + 1)) {
        set_error(err, errlen, "data.synthetic=%s needs model.vocab_size >= 8 (got %d) and "
                            "train.seq_len > %d (got %d): key, value and filler ranges and two "
                            "copies of the pairs must fit",
                  name, vocab_size, 4 * RETRIEVAL_PAIRS, T);
        return NULL;
    }
    if (vocab_size < 2) {
        set_error(err, errlen, "data.synthetic=%s needs model.vocab_size >= 2 (got %d)", name, vocab_size);
        return NULL;
    }
    Synthetic *s = xcalloc(1, sizeof *s);
    s->kind = kind;
    s->spread = strcmp(name, "retrieval_spread") == 0;
    s->T = T;
    s->S = vocab_size < SYNTH_MAX_SYMBOLS ? vocab_size : SYNTH_MAX_SYMBOLS;
    if (kind == TASK_MARKOV) {
        s->K = s->S < MARKOV_SUCCESSORS ? s->S : MARKOV_SUCCESSORS;
        s->next = xmalloc(sizeof(int) * s->S * s->K);
        s->cum = xmalloc(sizeof(double) * s->S * s->K);
        s->pi_cum = xmalloc(sizeof(double) * s->S);
        markov_build(s, seed);
    }
    if (kind == TASK_RETRIEVAL) s->K = s->S / 4 < RETRIEVAL_PAIRS ? s->S / 4 : RETRIEVAL_PAIRS;
    return s;
}

void synthetic_free(Synthetic *s) {
    if (!s) return;
    free(s->next);
    free(s->cum);
    free(s->pi_cum);
    free(s);
}

static void copy_sequence(const Synthetic *s, Rng *r, int *inputs, int *targets) {
    int H = s->T / 2;   // period: inputs[t] = inputs[t mod H]
    for (int t = 0; t < s->T; t++) inputs[t] = t < H ? (int)rng_below(r, (uint64_t)s->S) : inputs[t - H];
    for (int t = 0; t < s->T; t++) targets[t] = t < H ? -1 : inputs[(t + 1) % H];
}

// Keys: a partial Fisher-Yates shuffle of [0, S/4) gives K distinct ones. The opening pairs
// start at offset o (0, or uniform in [0, T - 4K] for retrieval_spread, drawn last so that
// retrieval's sequences stay what they were); the closing pairs always end the sequence.
static void retrieval_sequence(const Synthetic *s, Rng *r, int *inputs, int *targets) {
    const int K = s->K, nk = s->S / 4, T = s->T;
    int keys[SYNTH_MAX_SYMBOLS / 4], vals[RETRIEVAL_PAIRS], order[RETRIEVAL_PAIRS];
    for (int i = 0; i < nk; i++) keys[i] = i;
    for (int i = 0; i < K; i++) {
        int j = i + (int)rng_below(r, (uint64_t)(nk - i));
        int tmp = keys[i];
        keys[i] = keys[j];
        keys[j] = tmp;
        vals[i] = nk + (int)rng_below(r, (uint64_t)nk);
        order[i] = i;
    }
    for (int i = K - 1; i > 0; i--) {
        int j = (int)rng_below(r, (uint64_t)(i + 1));
        int tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    for (int t = 0; t < T; t++) {
        inputs[t] = 2 * nk + (int)rng_below(r, (uint64_t)(s->S - 2 * nk));   // filler
        targets[t] = -1;
    }
    const int o = s->spread ? (int)rng_below(r, (uint64_t)(T - 4 * K + 1)) : 0;
    for (int i = 0; i < K; i++) {
        inputs[o + 2 * i] = keys[i];
        inputs[o + 2 * i + 1] = vals[i];
        const int q = T - 2 * K + 2 * i;   // the closing copy, shuffled
        inputs[q] = keys[order[i]];
        inputs[q + 1] = vals[order[i]];
        targets[q] = vals[order[i]];
    }
}

static void markov_sequence(const Synthetic *s, Rng *r, int *inputs, int *targets) {
    int x = search_cum(s->pi_cum, s->S, (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0));
    for (int t = 0; t < s->T; t++) {
        inputs[t] = x;
        double u = (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
        x = s->next[(size_t)x * s->K + search_cum(s->cum + (size_t)x * s->K, s->K, u)];
        targets[t] = x;
    }
}

void synthetic_sequence(const Synthetic *s, uint64_t stream_seed, int *inputs, int *targets) {
    Rng r;
    rng_seed(&r, stream_seed);
    if (s->kind == TASK_COPY) copy_sequence(s, &r, inputs, targets);
    else if (s->kind == TASK_RETRIEVAL) retrieval_sequence(s, &r, inputs, targets);
    else markov_sequence(s, &r, inputs, targets);
}

double synthetic_loss_floor(const Synthetic *s) { return s->kind == TASK_MARKOV ? s->floor : 0.0; }
