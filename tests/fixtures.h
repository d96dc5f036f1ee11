// fixtures: the configurations that several test files start from.
#pragma once
#include "common/config.h"

// The AdamW hyperparameters the optimizer tests check against, set explicitly so that a change of
// the defaults does not change what the tests compute.
#define FIXTURE_BETA1 0.9f
#define FIXTURE_BETA2 0.95f
#define FIXTURE_EPS 1e-8f
#define FIXTURE_WEIGHT_DECAY 0.1f

// The defaults with FIXTURE_*'s AdamW hyperparameters.
static inline void fixture_adamw_config(Config *c) {
    config_defaults(c);
    c->optim.beta1 = FIXTURE_BETA1;
    c->optim.beta2 = FIXTURE_BETA2;
    c->optim.eps = FIXTURE_EPS;
    c->optim.weight_decay = FIXTURE_WEIGHT_DECAY;
}

// The defaults with the small GPT of the GPU tests: two layers, GQA through the fused qkv views
// (2 query heads, 1 key/value head), head size 64 (a size the CUDA flash kernels support), a
// vocabulary of 100, and deterministic attention without dropout.
static inline void fixture_gpu_model_config(Config *c) {
    config_defaults(c);
    c->model.n_layer = 2;
    c->model.n_head = 2;
    c->model.n_kv_head = 1;
    c->model.n_embd = 128;
    c->model.vocab_size = 100;
    c->model.max_seq_len = 64;
    c->attention.dropout = 0.0f;
    c->attention.deterministic = 1;
}
