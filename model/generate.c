#include "model/generate.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"

int sample_token(const float *logits, int V, float temperature, int top_k, Rng *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    // The k-th largest logit is the cut-off: everything below it gets probability 0.
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float *sorted = xmalloc((size_t)V * sizeof(float));
        for (int i = 0; i < V; i++) sorted[i] = logits[i];
        // Partial selection of the top_k largest (k is small in practice).
        for (int k = 0; k < top_k; k++) {
            int arg = k;
            for (int i = k + 1; i < V; i++)
                if (sorted[i] > sorted[arg]) arg = i;
            float t = sorted[k];
            sorted[k] = sorted[arg];
            sorted[arg] = t;
        }
        cutoff = sorted[top_k - 1];
        free(sorted);
    }
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= cutoff) sum += exp((double)(logits[i] - logits[best]) / temperature);
    double u = (double)rng_uniform(rng) * sum, acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cutoff) continue;
        acc += exp((double)(logits[i] - logits[best]) / temperature);
        last = i;
        if (acc > u) return i;
    }
    return last;
}

int gpt_generate(GPT *m, const int *prompt, int n_prompt, int n_new, float temperature, int top_k,
                 Rng *rng, int *out) {
    return gpt_generate_batch(m, 1, 0, prompt, n_prompt, n_new, temperature, top_k, rng, out);
}

int gpt_generate_batch(GPT *m, int B, int pos0, const int *prompt, int n_prompt, int n_new,
                       float temperature, int top_k, Rng *rngs, int *out) {
    const GPTConfig *cfg = gpt_cfg(m);
    float *logits = xmalloc((size_t)B * cfg->V * sizeof(float));   // (B, V)
    const int room = gpt_decode_positions(m) - pos0;
    const int n_fed = n_prompt < room ? n_prompt : room;
    gpt_decode_prefill(m, prompt, n_fed, B, pos0, logits);
    const int n = gpt_generate_from(m, B, pos0 + n_fed, logits, n_new, temperature, top_k, rngs, out);
    free(logits);
    return n;
}

int gpt_generate_from(GPT *m, int B, int pos, float *logits, int n_new, float temperature, int top_k,
                      Rng *rngs, int *out) {
    const GPTConfig *cfg = gpt_cfg(m);
    const int end = gpt_decode_positions(m);
    int *tokens = xmalloc((size_t)B * sizeof(int));   // (B) this step's
    int n = 0;
    for (; n < n_new && pos < end; n++, pos++) {
        for (int b = 0; b < B; b++)
            tokens[b] = out[(size_t)b * n_new + n] =
                sample_token(logits + (size_t)b * cfg->V, cfg->V, temperature, top_k, &rngs[b]);
        if (pos + 1 < end && n + 1 < n_new) gpt_decode_batch(m, tokens, B, pos, logits);
    }
    free(tokens);
    return n;
}
