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

// Mean loss over the non-ignored targets of n_batches batches from the start of d, over every
// rank of comm (NULL: this process alone; each rank reads its slice of every batch).
double eval_loss(GPT *m, Dataset *d, int B, int T, long long n_batches, Comm *comm,
                 const ContextParallel *cp) {
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
        for (int i = 0; i < B * TL; i++)
            if (ltg[i] >= 0) sum += losses[i], count++;
    }
    gpt_set_training(m, 1);
    free(in);
    free(tg);
    free(lin);
    free(ltg);
    free(losses);
    double sums[2] = {sum, (double)count};
    if (comm) comm->allreduce_host_f64(comm, sums, 2);
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}
