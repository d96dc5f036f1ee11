// generate: autoregressive sampling with the model's KV cache (temperature, top-k), for one
// sequence or a batch of them decoded together.
#pragma once
#include "common/rng.h"
#include "model/gpt.h"

// Picks the next token from logits (V) fp32: greedy when temperature == 0, else softmax of
// logits/temperature restricted to the top_k largest (top_k <= 0: all). Uses one uniform draw.
int sample_token(const float *logits, int V, float temperature, int top_k, Rng *rng);

// Feeds the prompt (n_prompt >= 1 tokens, gpt_decode_prefill) and draws up to n_new tokens into
// out; stops early at the end of the cache (gpt_decode_positions: max_seq_len unless
// gpt_decode_reserve made it shorter). Returns the number of tokens drawn. The batch of
// one of:
int gpt_generate(GPT *m, const int *prompt, int n_prompt, int n_new, float temperature, int top_k,
                 Rng *rng, int *out);
// B sequences decoded together (gpt_decode_batch), each starting from the same prompt at
// position pos0 (0, or after gpt_decode_seek): sequence b draws its tokens with rngs[b] alone
// and writes them to out + b * n_new (out is (B, n_new)), so it is the sequence gpt_generate
// draws with that generator (to rounding: the batched matmuls may sum in another order on a
// GPU). The prompt is prefilled (gpt_decode_prefill), then gpt_generate_from draws.
int gpt_generate_batch(GPT *m, int B, int pos0, const int *prompt, int n_prompt, int n_new,
                       float temperature, int top_k, Rng *rngs, int *out);
// The drawing half: B sequences whose caches hold positions [0, pos) and whose next-token
// logits (B, V) fp32 host are in logits (overwritten step by step) draw up to n_new tokens each
// into out (B, n_new) as gpt_generate_batch does, stopping at the end of the cache; returns
// the count.
int gpt_generate_from(GPT *m, int B, int pos, float *logits, int n_new, float temperature, int top_k,
                      Rng *rngs, int *out);
