// eval: the evaluation loop (train_gpt's periodic val loss and the eval subcommand).
#include "trainer/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// Batches of B x T that cover at most `tokens` tokens of d without reading a window twice
// (at least 1); synthetic data (0 tokens) is unbounded.
long long eval_batches(const Dataset *d, int B, int T, long long tokens) {
    long long n = tokens / ((long long)B * T);
    long long avail = (long long)dataset_num_tokens(d);
    if (avail > 0 && n > (avail - 1) / T / B) n = (avail - 1) / T / B;
    return n < 1 ? 1 : n;
}

// The loss sums of n_batches batches from the start of d into sums[0] (loss) and sums[1]
// (targets); with by_pos (NULL: not kept), also per window position t: loss into by_pos[2t],
// targets into by_pos[2t + 1] (T positions, no context parallelism).
static void eval_sums(GPT *m, Dataset *d, int B, int T, long long n_batches, const ContextParallel *cp,
                      double sums[2], double *by_pos) {
    const int TL = cp ? T / cp_get_layout(cp)->cp : T;
    int *in = xmalloc((size_t)B * T * sizeof(int)), *tg = xmalloc((size_t)B * T * sizeof(int));
    int *lin = xmalloc((size_t)B * TL * sizeof(int)), *ltg = xmalloc((size_t)B * TL * sizeof(int));
    float *losses = xmalloc((size_t)B * TL * sizeof(float));  // (B*TL)
    double sum = 0;
    long long count = 0;
    dataset_rewind(d);
    gpt_set_training(m, 0);
    for (long long b = 0; b < n_batches; b++) {
        dataset_next(d, in, tg);
        if (cp) {
            cp_take_local(cp, in, lin, B, T);
            cp_take_local(cp, tg, ltg, B, T);
        } else {
            memcpy(lin, in, (size_t)B * T * sizeof(int));
            memcpy(ltg, tg, (size_t)B * T * sizeof(int));
        }
        gpt_forward(m, lin, ltg, B, TL);
        gpt_losses_f32(m, losses);
        for (int i = 0; i < B * TL; i++) {
            if (ltg[i] < 0) continue;
            sum += losses[i], count++;
            if (by_pos) by_pos[2 * (i % TL)] += losses[i], by_pos[2 * (i % TL) + 1] += 1;
        }
    }
    gpt_set_training(m, 1);
    free(in);
    free(tg);
    free(lin);
    free(ltg);
    free(losses);
    sums[0] = sum;
    sums[1] = (double)count;
}

double eval_loss(GPT *m, Dataset *d, int B, int T, long long n_batches, Comm *comm,
                 const ContextParallel *cp) {
    double sums[2];
    eval_sums(m, d, B, T, n_batches, cp, sums, NULL);
    if (comm) comm->allreduce_host_f64(comm, sums, 2);
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

int eval_position_buckets(int T, EvalBucket *buckets, int max) {
    int n = 0;
    for (int first = 1, last = 128; first <= T && n < max; first = last + 1, last *= 2)
        buckets[n++] = (EvalBucket){first, last < T ? last : T, 0.0, 0};
    return n;
}

double eval_loss_by_position(GPT *m, Dataset *d, int B, int T, long long n_batches, EvalBucket *buckets,
                             int n_buckets) {
    double sums[2], *by_pos = xcalloc((size_t)2 * T, sizeof(double));   // (T, 2)
    eval_sums(m, d, B, T, n_batches, NULL, sums, by_pos);
    for (int k = 0; k < n_buckets; k++) {
        double loss = 0, n = 0;
        for (int p = buckets[k].first; p <= buckets[k].last; p++) loss += by_pos[2 * (p - 1)], n += by_pos[2 * p - 1];
        buckets[k].loss = n > 0 ? loss / n : NAN;
        buckets[k].targets = (long long)n;
    }
    free(by_pos);
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}
