// generate: autoregressive sampling with the model's KV cache (temperature, top-k), batch 1.
#pragma once
#include "common/rng.h"
#include "model/gpt.h"

// Picks the next token from logits (V) fp32: greedy when temperature == 0, else softmax of
// logits/temperature restricted to the top_k largest (top_k <= 0: all). Uses one uniform draw.
int sample_token(const float *logits, int V, float temperature, int top_k, Rng *rng);

// Feeds the prompt (n_prompt >= 1 tokens) and draws up to n_new tokens into out; stops early at
// the model's max_seq_len. Returns the number of tokens drawn.
int gpt_generate(GPT *m, const int *prompt, int n_prompt, int n_new, float temperature, int top_k,
                 Rng *rng, int *out);
