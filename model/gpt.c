// gpt: the GPT-2 model (learned, rotary or ALiBi positions, GQA, sliding windows, packed
// documents) written once over the Backend ops. It never touches backend memory directly: the
// same code drives the CPU and the CUDA backends.
//
// Per block (pre-LayerNorm):  x' = x + proj(attention(qkv(ln1(x))));  x'' = x' + fcproj(gelu(fc(ln2(x'))))
// Head: logits = lnf(x_L) @ wte^T over Vp padded columns, of which the first V are real.
// The head runs over chunks of rows (train.classifier_chunk, or at most HEAD_CHUNK_BYTES of
// logits each), so the logits never exist for the whole batch: the forward turns each chunk
// into its losses and log-sum-exp and keeps only those; the backward recomputes each chunk's
// logits (all but the last chunk of the forward, still in the buffer) and turns them into
// dlogits in place, then into that chunk's rows of the lnf gradient and the chunk's share of
// the wte gradient. gpt_logits_f32 computes the logits it is asked for chunk by chunk from the
// kept lnf output.
//
// Positions: learned (wpe table added to the token embedding), rope (q and k rotated in place in
// the fused qkv buffer right after its matmul, from a cos/sin table computed once in
// gpt_create; half-split convention, see Backend.rope_forward) or alibi (the attention kernel's
// slopes). attention.window applies to the layers l with l % attention.window_every == 0, and
// attention.sparse's block pattern (model/sparse_lists.h) to those with l % sparse_every == 0.
// With attention.doc_mask, gpt_forward splits each row into documents after every
// data.eot_token: attention stays inside a document (the kernels' cu_seqlens path) and the
// positions given to wpe or RoPE restart at 0 in each document. The eot token itself ends its
// document, so it is the last token the document sees.
//
// Context parallelism (gpt_set_ring): the batch holds this rank's zigzag part of each sequence,
// positions are the tokens' global ones, and training attention runs around the ring
// (model/ring_attention.h); the loss mean divides by the whole ring's target count.
//
// Dropout (training forwards with targets only): attention.dropout on the attention
// probabilities, model.dropout on the embedding sum and on the proj and fcproj outputs before
// their residual adds, as nanoGPT. Every mask is Philox keyed by train.seed at an offset that is
// a pure function of the micro-step set by gpt_set_rng_step and of the layer and site, so
// backward, recomputation and a resumed run regenerate exactly the same masks. After
// gpt_set_rng_base the micro-step counts from a base in backend memory that the kernels read
// when they run (the offset's host part is then relative to it), so a captured CUDA graph draws
// each replay's own masks.
//
// train.recompute trades compute for activation memory: attn_gelu keeps one attention output and
// one GELU output for all layers and recomputes them in backward (16C -> 11C values per token
// and layer); block keeps only each block's output and reruns the whole block forward in
// backward (16C -> 1C). Recomputation reuses the forward's dropout masks, so gradients are
// bitwise those of recompute = none.
#include "model/gpt.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/rng.h"
#include "model/ring_attention.h"
#include "model/sparse_lists.h"

// Logits per head chunk unless train.classifier_chunk sets the rows: 2 GiB, so a bf16 batch of
// 16 x 1024 tokens over GPT-2's vocabulary (1.5 GiB of logits) is one chunk and recomputes
// nothing; 524,288 tokens run in 25 chunks.
#define HEAD_CHUNK_BYTES ((size_t)2 << 30)
// Prompt tokens per prefill chunk: GPT-2 124M's activations for them are about 110 MiB in
// bf16, and 4096 queries give the flash kernels 32 query tiles per head to spread over the GPU.
#define PREFILL_ROWS 4096
// Where the attention is materialised, the score matrices of one prefill chunk stay within this.
#define PREFILL_NAIVE_BYTES ((size_t)1 << 30)

// The per-layer tensors, in the order they appear in the flat parameter vector.
enum {
    LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
    N_LAYER_TENSORS
};


// Activations of one block for N = B*T tokens (decode uses one set with N = 1). With
// recomputation some of these buffers are shared by every layer.
typedef struct {
    void *ln1;                    // (N, C)
    float *ln1_mean, *ln1_rstd;   // (N)
    void *qkv;                    // (N, (NH + 2*NKV) * HS): per token [q | k | v]
    void *atty;                   // (N, C) attention output, heads side by side
    float *lse;                   // (B, NH, T) attention log-sum-exp
    void *res_attn;               // (N, C) x + attention branch
    void *ln2;                    // (N, C)
    float *ln2_mean, *ln2_rstd;   // (N)
    void *fch_pre;                // (N, 4C) fc output before GELU
    void *fch;                    // (N, 4C) after GELU
    void *res_mlp;                // (N, C) x + both branches: the next block's input
} BlockActs;

struct GPT {
    GPTConfig cfg;
    Backend *be;
    size_t ds;                    // bytes per element of be->dtype
    int B, T;                     // largest batch the activations hold
    int OCq;                      // (NH + 2*NKV) * HS

    ParamTensor *tensors;
    int n_tensors, wte_i, wpe_i, layer0_i, lnf_i;   // wpe_i = -1 without a learned table
    size_t n_params;
    void *params, *grads;         // (n_params) backend memory

    // run options
    AttnImpl impl;
    int window, window_every, deterministic, training;
    int eot;                      // data.eot_token when attention.doc_mask is on, else -1
    Recompute recompute;
    float attn_dropout, resid_dropout;   // attention.dropout, model.dropout
    uint64_t dropout_seed;               // train.seed
    uint64_t rng_step;                   // micro-step whose masks the next forward draws
    uint64_t *rng_base;                  // (1) backend: Philox offset of gpt_set_rng_base's
                                         // micro-step, added to every site's; NULL: none
    GradReadyFn grad_ready;              // gpt_set_grad_ready_hook, or NULL
    void *grad_ready_ctx;
    float *alibi;                 // (NH) backend fp32, or NULL
    float *rope;                  // (maxT, HS/2, 2) backend fp32 [cos, sin] per position, or NULL
    RingAttention *ring;          // context parallelism (gpt_set_ring), or NULL
    SparseLists *sparse;          // attention.sparse's block lists per shape, or NULL (dense)
    int *ring_pos;                // (B, T) backend int32: global positions of the local tokens

    // every backend allocation, released by gpt_free
    void **allocs;
    int n_allocs;

    // forward activations and backward scratch, sized for B x T
    int *tokens, *targets;        // (B, T) backend int32 of the last forward: own_* (gpt_forward)
                                  // or the caller's device batch (gpt_forward_async)
    int *own_tokens, *own_targets;   // (B, T) backend int32
    int *doc_pos, *cu_seqlens;    // (B, T), (B*T + 1) backend int32: positions within documents
                                  // and document offsets (doc_mask only, else NULL)
    int *doc_pos_host, *cu_host;  // (B, T), (B*T + 1) their host copies
    void *encoded;                // (N, C) embeddings
    BlockActs *acts;              // (L)
    void *lnf;                    // (N, C)
    float *lnf_mean, *lnf_rstd;   // (N)
    void *logits;                 // (head_rows, Vp): one chunk of the head; dlogits in backward
    int head_rows, head_cap;      // rows per head chunk; rows the logits buffer holds
    int head_chunk;               // first row of the chunk whose logits the buffer holds, or -1
    float *losses;                // (N) backend fp32
    float *logit_lse;             // (N) backend fp32: log-sum-exp of each row of logits
    float *losses_host;           // (N)
    void *scratch;                // (N, C) branch output before the residual add
    void *dres;                   // (N, C) gradient of the residual stream
    void *dtmp;                   // (N, C) copy of dres handed to matmul_backward as scratch
    void *dln;                    // (N, C) gradient of a LayerNorm output
    void *datty;                  // (N, C)
    void *dqkv;                   // (N, OCq)
    void *dfch;                   // (N, 4C)

    // last forward
    int last_B, last_T, n_valid, has_targets, logits_valid;
    long long n_loss;             // targets the loss is a mean over (gpt_set_loss_tokens)
    double loss_sum;              // sum of the last forward's counted losses
    int drop_attn, drop_resid;    // it applied attention / residual dropout
    int n_docs;                   // documents in the batch (doc_mask), else 0
    const int *pos;               // doc_pos when doc_mask, else NULL (pos = t)
    uint64_t dropout_base;        // Philox offset of its first dropout site

    // incremental decoding of dec_B sequences (allocated by gpt_decode_reserve or the first step)
    int dec_B;
    BlockActs dec;                // N = dec_B
    void *dec_x, *dec_scratch, *dec_lnf, *dec_logits;  // (B, C), (B, C), (B, C), (B, Vp)
    float *dec_lnf_mean, *dec_lnf_rstd;                // (B)
    float *dec_logits_host;       // (B, Vp) host: a step's logits in one download, when B > 1
                                  // and V < Vp; else NULL
    int ids_cap;                  // max(dec_B, pre_cap)
    int *ids, *ids_host;          // (2, ids_cap) backend int32 and its host staging: a step's or
                                  // a prefill chunk's n tokens, then their n positions
    int pre_rows, pre_cap;        // rows per prefill chunk (gpt_set_prefill_rows); rows its
                                  // buffers hold
    BlockActs pre;                // N = pre_cap: one prefill chunk of sequence 0
    void *pre_x, *pre_scratch;    // (pre_cap, C)
    void *kv;                     // (L, 2, B, NKV, kv_T, HS): per layer the keys, then the values;
                                  // a head's positions are contiguous (attn_decode's layout)
    int kv_T;                     // positions per sequence the cache holds (<= maxT)
    int kv_len;                   // positions cached
    int decode_unsplit;           // decode attention through attn_forward, not attn_decode
                                  // (gpt_set_decode_split(m, 0))
};

static void *balloc(GPT *m, size_t bytes) {
    void *p = m->be->alloc(m->be, bytes);
    m->allocs = xrealloc(m->allocs, (size_t)(m->n_allocs + 1) * sizeof(void *));
    m->allocs[m->n_allocs++] = p;
    return p;
}

static void *at(void *base, size_t elems, size_t ds) { return (char *)base + elems * ds; }

// The dropout sites of one micro-step, each drawing from its own Philox offset: per layer the
// attention probabilities, the attention output projection and the MLP output; then the
// embeddings (as layer L). Micro-step s's sites start at s * sites_per_step(m).
enum { SITE_ATTN = 0, SITE_PROJ = 1, SITE_MLP = 2, SITES_PER_LAYER = 3 };

static uint64_t sites_per_step(const GPT *m) {
    return (uint64_t)(SITES_PER_LAYER * m->cfg.L + 1);
}

// The offset of site (l, site) of the last forward's micro-step; with rng_base the kernels add
// the base's offset to it.
static uint64_t site_offset(const GPT *m, int l, int site) {
    return m->dropout_base + (uint64_t)l * SITES_PER_LAYER + (uint64_t)site;
}

// The mask of residual dropout site (l, site), for an op that applies it on the way (its own
// backward on a gradient); p = 0 while the last forward runs without residual dropout.
static DropMask resid_mask(const GPT *m, int l, int site) {
    const DropMask d = {m->drop_resid ? m->resid_dropout : 0.0f, m->dropout_seed, site_offset(m, l, site),
                        m->rng_base};
    return d;
}

// Residual dropout of site (l, site) over x (n), in place.
static void resid_dropout(GPT *m, void *x, size_t n, int l, int site) {
    const DropMask d = resid_mask(m, l, site);
    m->be->dropout(m->be, x, n, &d);
}

// Pointer to tensor i inside the flat buffer `base` (params or grads).
static void *tensor_ptr(const GPT *m, void *base, int i) {
    return at(base, m->tensors[i].offset, m->ds);
}

static void *layer_ptr(const GPT *m, void *base, int l, int which) {
    return tensor_ptr(m, base, m->layer0_i + l * N_LAYER_TENSORS + which);
}

GPTConfig gpt_config_from(const Config *c) {
    GPTConfig g;
    memset(&g, 0, sizeof g);
    g.V = c->model.vocab_size;
    g.Vp = (g.V + 127) / 128 * 128;
    g.maxT = c->model.max_seq_len;
    g.L = c->model.n_layer;
    g.NH = c->model.n_head;
    g.NKV = c->model.n_kv_head > 0 ? c->model.n_kv_head : c->model.n_head;
    g.C = c->model.n_embd;
    g.HS = g.NH > 0 ? g.C / g.NH : 0;
    g.pos = c->model.pos_embedding;
    g.rope_theta = c->model.rope_theta;
    g.rope_dims = c->model.rope_dims;
    return g;
}

// The model's rules are config_check_model's (the ones config_validate applies, with the same
// messages): a GPTConfig may also be built without a config. Bad input exits with code 2.
static void check_config(const GPTConfig *g, int B, int T) {
    const ModelShape shape = {g->L, g->NH, g->NKV, g->C, g->V, g->maxT, g->pos, g->rope_theta, g->rope_dims};
    char err[ERR_LEN];
    if (config_check_model(&shape, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    CHECK(g->HS == g->C / g->NH && g->Vp % 128 == 0 && g->Vp >= g->V);
    if (B < 1 || T < 1 || T > g->maxT)
        fatal(EXIT_USAGE, "batch %d x %d: need B >= 1 and 1 <= T <= model.max_seq_len (%d)", B, T,
              g->maxT);
}

static void add_tensor(GPT *m, int *cap, const char *name, int d0, int d1, int decay) {
    if (m->n_tensors == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        m->tensors = xrealloc(m->tensors, (size_t)*cap * sizeof(ParamTensor));
    }
    ParamTensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 0;
    t->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    t->offset = m->n_params;
    t->decay = decay;
    m->n_params += t->numel;
}

static void build_tensors(GPT *m, int decay_wpe) {
    const GPTConfig *g = &m->cfg;
    int cap = 0, C = g->C;
    char name[64];
    m->wte_i = m->n_tensors;
    add_tensor(m, &cap, "wte", g->Vp, C, 1);
    m->wpe_i = -1;
    if (g->pos == POS_LEARNED) {
        m->wpe_i = m->n_tensors;
        add_tensor(m, &cap, "wpe", g->maxT, C, decay_wpe);
    }
    m->layer0_i = m->n_tensors;
    static const char *const names[N_LAYER_TENSORS] = {
        "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
        "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
        "mlp.proj.weight", "mlp.proj.bias"};
    const int rows[N_LAYER_TENSORS] = {C, C, m->OCq, m->OCq, C, C, C, C, 4 * C, 4 * C, C, C};
    const int cols[N_LAYER_TENSORS] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
    for (int l = 0; l < g->L; l++)
        for (int k = 0; k < N_LAYER_TENSORS; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
            add_tensor(m, &cap, name, rows[k], cols[k], cols[k] > 0);
        }
    m->lnf_i = m->n_tensors;
    add_tensor(m, &cap, "lnf.weight", C, 0, 0);
    add_tensor(m, &cap, "lnf.bias", C, 0, 0);
}

static void *need(GPT *m, void *p, size_t bytes) { return p ? p : balloc(m, bytes); }

// The angles are computed in double (positions reach 1e5 and more, where an fp32 angle would
// already be off by ~1e-2 rad) and rounded once to fp32. A never-rotated pair has inv_freq 0:
// cos 0 and sin 0 are exactly 1 and 0, so the backends' rotation leaves it bit for bit.
void gpt_rope_table_host(const GPTConfig *g, float *host) {
    const int half = g->HS / 2, R = g->rope_dims > 0 ? g->rope_dims : g->HS;
    for (int d = 0; d < half; d++) {
        const double inv_freq = d < R / 2 ? pow((double)g->rope_theta, -2.0 * d / R) : 0.0;
        for (int t = 0; t < g->maxT; t++) {
            host[((size_t)t * half + d) * 2] = (float)cos(t * inv_freq);
            host[((size_t)t * half + d) * 2 + 1] = (float)sin(t * inv_freq);
        }
    }
}

// The model's RoPE table (gpt_rope_table_host) in backend memory.
static float *rope_table(GPT *m) {
    const size_t n = (size_t)m->cfg.maxT * (m->cfg.HS / 2) * 2;
    float *host = xmalloc(n * sizeof(float));   // (maxT, HS/2, 2)
    gpt_rope_table_host(&m->cfg, host);
    float *table = balloc(m, n * sizeof(float));
    m->be->upload(m->be, table, host, n * sizeof(float));
    free(host);
    return table;
}

// Allocates every buffer of `a` that is still NULL (the others are shared with another layer).
static void alloc_block(GPT *m, BlockActs *a, int B, int T) {
    size_t N = (size_t)B * T, C = m->cfg.C, ds = m->ds;
    a->ln1 = need(m, a->ln1, N * C * ds);
    a->ln1_mean = need(m, a->ln1_mean, N * sizeof(float));
    a->ln1_rstd = need(m, a->ln1_rstd, N * sizeof(float));
    a->qkv = need(m, a->qkv, N * m->OCq * ds);
    a->atty = need(m, a->atty, N * C * ds);
    a->lse = need(m, a->lse, N * m->cfg.NH * sizeof(float));
    a->res_attn = need(m, a->res_attn, N * C * ds);
    a->ln2 = need(m, a->ln2, N * C * ds);
    a->ln2_mean = need(m, a->ln2_mean, N * sizeof(float));
    a->ln2_rstd = need(m, a->ln2_rstd, N * sizeof(float));
    a->fch_pre = need(m, a->fch_pre, N * 4 * C * ds);
    a->fch = need(m, a->fch, N * 4 * C * ds);
    a->res_mlp = need(m, a->res_mlp, N * C * ds);
}

static void alloc_activations(GPT *m) {
    size_t N = (size_t)m->B * m->T, C = m->cfg.C, ds = m->ds;
    m->tokens = m->own_tokens = balloc(m, N * sizeof(int));
    m->targets = m->own_targets = balloc(m, N * sizeof(int));
    if (m->eot >= 0) {
        m->doc_pos = balloc(m, N * sizeof(int));
        m->cu_seqlens = balloc(m, (N + 1) * sizeof(int));
        m->doc_pos_host = xcalloc(N, sizeof(int));
        m->cu_host = xcalloc(N + 1, sizeof(int));
    }
    m->encoded = balloc(m, N * C * ds);
    m->acts = xcalloc((size_t)m->cfg.L, sizeof(BlockActs));
    alloc_block(m, &m->acts[0], m->B, m->T);
    const BlockActs *first = &m->acts[0];   // its recomputed buffers serve every layer
    for (int l = 1; l < m->cfg.L; l++) {
        BlockActs *a = &m->acts[l];
        if (m->recompute == RECOMPUTE_BLOCK) {
            *a = *first;
            a->res_mlp = NULL;   // each block keeps its output: the next block's input
        } else if (m->recompute == RECOMPUTE_ATTN_GELU) {
            a->atty = first->atty;
            a->fch = first->fch;
        }
        alloc_block(m, a, m->B, m->T);
    }
    m->lnf = balloc(m, N * C * ds);
    m->lnf_mean = balloc(m, N * sizeof(float));
    m->lnf_rstd = balloc(m, N * sizeof(float));
    m->logits = balloc(m, (size_t)m->head_rows * m->cfg.Vp * ds);
    m->losses = balloc(m, N * sizeof(float));
    m->logit_lse = balloc(m, N * sizeof(float));
    m->losses_host = xcalloc(N, sizeof(float));
    m->scratch = balloc(m, N * C * ds);
    m->dres = balloc(m, N * C * ds);
    m->dtmp = balloc(m, N * C * ds);
    m->dln = balloc(m, N * C * ds);
    m->datty = balloc(m, N * C * ds);
    m->dqkv = balloc(m, N * m->OCq * ds);
    m->dfch = balloc(m, N * 4 * C * ds);
}

GPT *gpt_create(const GPTConfig *cfg, Backend *be, int B, int T, const Config *run) {
    check_config(cfg, B, T);
    GPT *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->ds = dtype_size(be->dtype);
    m->B = B;
    m->T = T;
    m->OCq = (cfg->NH + 2 * cfg->NKV) * cfg->HS;
    m->impl = ATTN_IMPL_FLASH;
    m->window = -1;
    m->window_every = 1;
    m->eot = -1;
    m->training = 1;
    if (run) {
        m->impl = (AttnImpl)run->attention.impl;
        m->window = run->attention.window;
        m->window_every = run->attention.window_every > 0 ? run->attention.window_every : 1;
        if (run->attention.doc_mask) {
            if (run->data.eot_token < 0 || run->data.eot_token >= cfg->V)
                fatal(EXIT_USAGE, "attention.doc_mask needs data.eot_token in [0, %d), got %d",
                      cfg->V, run->data.eot_token);
            m->eot = run->data.eot_token;
        }
        m->deterministic = run->attention.deterministic;
        m->attn_dropout = run->attention.dropout;
        m->resid_dropout = run->model.dropout;
        m->dropout_seed = (uint64_t)run->train.seed;
        m->recompute = run->train.recompute;
    }
    m->sparse = sparse_lists_create(be, run);
    build_tensors(m, run ? run->optim.decay_embeddings : 0);
    m->params = balloc(m, m->n_params * m->ds);
    m->grads = balloc(m, m->n_params * m->ds);
    if (cfg->pos == POS_ALIBI) {
        // ALiBi slopes of the paper for NH heads: 2^(-8 h / NH), h = 1..NH.
        float *slopes = xmalloc((size_t)cfg->NH * sizeof(float));
        for (int h = 0; h < cfg->NH; h++) slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)cfg->NH);
        m->alibi = balloc(m, (size_t)cfg->NH * sizeof(float));
        be->upload(be, m->alibi, slopes, (size_t)cfg->NH * sizeof(float));
        free(slopes);
    }
    if (cfg->pos == POS_ROPE) m->rope = rope_table(m);
    const size_t head_rows = run && run->train.classifier_chunk > 0
                                 ? (size_t)run->train.classifier_chunk
                                 : HEAD_CHUNK_BYTES / ((size_t)cfg->Vp * m->ds);
    m->head_cap = m->head_rows = (size_t)B * T < head_rows ? B * T : (int)head_rows;
    m->head_chunk = -1;
    m->pre_cap = m->pre_rows = cfg->maxT < PREFILL_ROWS ? cfg->maxT : PREFILL_ROWS;
    alloc_activations(m);
    return m;
}

void gpt_free(GPT *m) {
    if (!m) return;
    ring_attention_free(m->ring);
    sparse_lists_free(m->sparse);
    for (int i = 0; i < m->n_allocs; i++) m->be->release(m->be, m->allocs[i]);
    free(m->allocs);
    free(m->acts);
    free(m->losses_host);
    free(m->ids_host);
    free(m->dec_logits_host);
    free(m->doc_pos_host);
    free(m->cu_host);
    free(m->tensors);
    free(m);
}

const GPTConfig *gpt_cfg(const GPT *m) { return &m->cfg; }
Backend *gpt_backend(const GPT *m) { return m->be; }
size_t gpt_num_params(const GPT *m) { return m->n_params; }
int gpt_num_tensors(const GPT *m) { return m->n_tensors; }
const ParamTensor *gpt_tensor(const GPT *m, int i) { return &m->tensors[i]; }
void *gpt_params(GPT *m) { return m->params; }
void *gpt_grads(GPT *m) { return m->grads; }
void gpt_set_training(GPT *m, int training) { m->training = training; }
void gpt_set_rng_step(GPT *m, uint64_t step) { m->rng_step = step; }

// (base + s) * S = base * S + s * S modulo 2^64: the kernels' sum is micro-step base + s's offset.
void gpt_set_rng_base(GPT *m, uint64_t base) {
    if (!(m->attn_dropout > 0.0f || m->resid_dropout > 0.0f)) return;
    if (!m->rng_base) m->rng_base = balloc(m, sizeof(uint64_t));
    m->be->set_u64(m->be, m->rng_base, base * sites_per_step(m));
}

int gpt_set_prefill_rows(GPT *m, int rows, char *err, size_t errlen) {
    if (rows < 1 || rows > m->pre_cap)
        return set_error(err, errlen, "%d rows per prefill chunk: need 1 to %d", rows, m->pre_cap);
    m->pre_rows = rows;
    return 0;
}

int gpt_set_head_rows(GPT *m, int rows, char *err, size_t errlen) {
    if (rows < 1 || rows > m->head_cap)
        return set_error(err, errlen, "%d rows per classifier chunk: need 1 to %d", rows, m->head_cap);
    m->head_rows = rows;
    m->head_chunk = -1;
    return 0;
}

void gpt_init_weights_host(const GPT *m, float *host, uint64_t seed) {
    const GPTConfig *g = &m->cfg;
    const float std = 0.02f, resid_std = 0.02f / sqrtf(2.0f * (float)g->L);
    Rng rng;
    rng_seed(&rng, seed);
    memset(host, 0, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        float *p = host + t->offset;
        int k = i >= m->layer0_i && i < m->lnf_i ? (i - m->layer0_i) % N_LAYER_TENSORS : -1;
        int is_ln_weight = k == LN1_W || k == LN2_W || i == m->lnf_i;
        size_t n = i == m->wte_i ? (size_t)g->V * g->C : t->numel;  // padded wte rows stay 0
        if (is_ln_weight) {
            for (size_t j = 0; j < n; j++) p[j] = 1.0f;
        } else if (t->ndim == 2) {
            float s = k == PROJ_W || k == FCPROJ_W ? resid_std : std;
            rng_normal_fill(&rng, p, n, s);
        }
    }
}

void gpt_set_params_f32(GPT *m, const float *host) {
    m->be->upload_f32(m->be, m->params, host, m->n_params);
}
void gpt_get_params_f32(GPT *m, float *host) {
    m->be->download_f32(m->be, host, m->params, m->n_params);
}
void gpt_get_grads_f32(GPT *m, float *host) {
    m->be->download_f32(m->be, host, m->grads, m->n_params);
}
void gpt_zero_grad(GPT *m) { m->be->fill_zero(m->be, m->grads, m->n_params * m->ds); }

// Layer l's sliding window (attention.window on every window_every-th layer), -1 = unbounded.
static int layer_window(const GPT *m, int l) { return l % m->window_every == 0 ? m->window : -1; }

// Attention of layer l over the fused qkv buffer of a (B, T) batch: q, k, v are views into the
// per-token row [q (NH*HS) | k (NKV*HS) | v (NKV*HS)], no permute copies.
static AttnParams attn_params(const GPT *m, BlockActs *a, int B, int T, int l) {
    const GPTConfig *g = &m->cfg;
    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, a->qkv, a->atty, B, T, g->NH, g->NKV, g->HS, m->ds);
    p.lse = a->lse;
    p.causal = 1;
    p.window_left = layer_window(m, l);
    p.window_right = -1;   // causal already hides every later key
    p.alibi_slopes = m->alibi;
    p.impl = m->impl;
    p.deterministic = m->deterministic;
    return p;
}

// The attention of layer l over a (B, T) training batch, with the last forward's dropout mask.
// With packed documents, the last forward's document boundaries; on sparse layers, the block
// lists of (T, T).
static AttnParams layer_attn(GPT *m, BlockActs *a, int B, int T, int l) {
    AttnParams p = attn_params(m, a, B, T, l);
    sparse_lists_apply(m->sparse, &p, l);
    if (m->n_docs > 0) {
        p.cu_seqlens = m->cu_seqlens;
        p.n_docs = m->n_docs;
    }
    if (m->drop_attn) {
        p.dropout_p = m->attn_dropout;
        p.seed = m->dropout_seed;
        p.offset = site_offset(m, l, SITE_ATTN);
        p.offset_dev = m->rng_base;
    }
    return p;
}

// The layer's attention: through the ring under context parallelism (every rank of the ring
// takes part), else on this process's keys alone. Decoding never uses the ring: it runs over
// this process's cache, through attn_decode unless gpt_set_decode_split turned it off.
static void attention_forward(GPT *m, AttnParams *p, int decoding) {
    if (decoding && !m->decode_unsplit) backend_attention_decode(m->be, p);
    else if (!decoding && m->ring) ring_attention_forward(m->ring, p);
    else backend_attention(m->be, p, 0);
}
static void attention_backward(GPT *m, AttnParams *p) {
    if (m->ring) ring_attention_backward(m->ring, p);
    else backend_attention(m->be, p, 1);
}

// Decoding: the keys and values of a (B, T) batch in a->qkv into layer l's cache at positions
// pos .. pos + T - 1 of its first B sequences, by head rows: for one token per sequence (a
// step), copy_2d over the batch rows or over the heads, whichever is fewer calls; for a prefill
// chunk, over each sequence's tokens, one call per head.
static void kv_store(GPT *m, int l, const BlockActs *a, int pos, int B, int T) {
    const GPTConfig *g = &m->cfg;
    const size_t ds = m->ds, HS = g->HS, NKV = g->NKV, OCq = m->OCq;
    const size_t head = (size_t)m->kv_T * HS, seq = NKV * head;   // cache elements per head, per sequence
    for (int kv = 0; kv < 2; kv++) {
        char *dst = at(m->kv, ((size_t)(2 * l + kv) * m->dec_B * seq + pos * HS), ds);
        const char *src = at(a->qkv, (size_t)(g->NH + kv * g->NKV) * HS, ds);
        if (T == 1 && (size_t)B <= NKV)
            for (size_t b = 0; b < (size_t)B; b++)
                m->be->copy_2d(m->be, dst + b * seq * ds, head * ds, src + b * OCq * ds, HS * ds,
                               HS * ds, NKV);
        else if (T == 1)
            for (size_t h = 0; h < NKV; h++)
                m->be->copy_2d(m->be, dst + h * head * ds, seq * ds, src + h * HS * ds, OCq * ds,
                               HS * ds, B);
        else
            for (size_t b = 0; b < (size_t)B; b++)
                for (size_t h = 0; h < NKV; h++)
                    m->be->copy_2d(m->be, dst + (b * seq + h * head) * ds, HS * ds,
                                   src + (b * T * OCq + h * HS) * ds, OCq * ds, HS * ds, T);
    }
}

// One block forward for N tokens: x_out = block(x_in) (x_out may alias x_in). `p` must describe
// the attention with q/out/lse in `a`; with kv_pos >= 0 (decoding), the keys and values of the
// (p->B, T) tokens are first stored in the cache from that position on (p's k and v already
// point into it). pos (N)
// backend int32 gives the RoPE positions (NULL: i % T). With drop, the last forward's residual
// dropout masks apply to both branch outputs (inside the residual adds).
static void block_forward(GPT *m, int l, BlockActs *a, const void *x_in, void *x_out, void *scratch,
                          int N, int T, const int *pos, AttnParams *p, int kv_pos, int drop) {
    Backend *be = m->be;
    const int C = m->cfg.C;
    void *w = m->params;
    be->layernorm_forward(be, a->ln1, a->ln1_mean, a->ln1_rstd, x_in, layer_ptr(m, w, l, LN1_W),
                          layer_ptr(m, w, l, LN1_B), N, C);
    be->matmul_forward(be, a->qkv, NULL, a->ln1, layer_ptr(m, w, l, QKV_W), layer_ptr(m, w, l, QKV_B),
                       N, C, m->OCq, EPI_NONE);
    if (m->rope)
        be->rope_forward(be, a->qkv, m->rope, pos, N, T, m->cfg.NH, m->cfg.NKV, m->cfg.HS);
    if (kv_pos >= 0) kv_store(m, l, a, kv_pos, p->B, T);
    attention_forward(m, p, kv_pos >= 0);
    be->matmul_forward(be, scratch, NULL, a->atty, layer_ptr(m, w, l, PROJ_W),
                       layer_ptr(m, w, l, PROJ_B), N, C, C, EPI_NONE);
    const DropMask proj_drop = resid_mask(m, l, SITE_PROJ), mlp_drop = resid_mask(m, l, SITE_MLP);
    be->add_layernorm_forward(be, a->res_attn, a->ln2, a->ln2_mean, a->ln2_rstd, x_in, scratch,
                              layer_ptr(m, w, l, LN2_W), layer_ptr(m, w, l, LN2_B), N, C,
                              drop ? &proj_drop : NULL);
    be->matmul_forward(be, a->fch, a->fch_pre, a->ln2, layer_ptr(m, w, l, FC_W),
                       layer_ptr(m, w, l, FC_B), N, C, 4 * C, EPI_GELU);
    be->matmul_forward(be, scratch, NULL, a->fch, layer_ptr(m, w, l, FCPROJ_W),
                       layer_ptr(m, w, l, FCPROJ_B), N, 4 * C, C, EPI_NONE);
    be->add(be, x_out, a->res_attn, scratch, (size_t)N * C, drop ? &mlp_drop : NULL);
}

// The logits of head rows [r0, r0 + n) of the last forward into the chunk buffer.
static void head_logits(GPT *m, int r0, int n) {
    m->be->matmul_forward(m->be, m->logits, NULL, at(m->lnf, (size_t)r0 * m->cfg.C, m->ds),
                          tensor_ptr(m, m->params, m->wte_i), NULL, n, m->cfg.C, m->cfg.Vp,
                          EPI_NONE);
    m->head_chunk = r0;
}

static int min_int(int a, int b) { return a < b ? a : b; }

// The loss and log-sum-exp of each of the N rows, chunk by chunk (targets uploaded).
static void head_forward(GPT *m, int N) {
    const GPTConfig *g = &m->cfg;
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        const int n = min_int(m->head_rows, N - r0);
        head_logits(m, r0, n);
        m->be->softmax_xent(m->be, m->logits, m->losses + r0, m->logit_lse + r0, m->targets + r0,
                            n, g->V, g->Vp, 0.0f);
    }
}

// dlnf (N, C) = dlogits @ wte and dwte += dlogits^T @ lnf, dlogits = dscale * (softmax - onehot),
// chunk by chunk from the last one (whose logits the forward left in the buffer).
static void head_backward(GPT *m, int N, float dscale) {
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    for (int r0 = (N - 1) / m->head_rows * m->head_rows; r0 >= 0; r0 -= m->head_rows) {
        const int n = min_int(m->head_rows, N - r0);
        if (m->head_chunk != r0) head_logits(m, r0, n);
        be->softmax_xent(be, m->logits, m->losses + r0, m->logit_lse + r0, m->targets + r0, n,
                         g->V, g->Vp, dscale);
        be->matmul_backward(be, at(m->dln, (size_t)r0 * g->C, m->ds),
                            tensor_ptr(m, m->grads, m->wte_i), NULL, m->logits, NULL,
                            at(m->lnf, (size_t)r0 * g->C, m->ds),
                            tensor_ptr(m, m->params, m->wte_i), n, g->C, g->Vp, EPI_NONE);
    }
    m->head_chunk = -1;   // the buffer holds dlogits now
}

// Token ids must lie in [0, V); targets too, except negative ones, which mean "ignore".
// Returns the number of ids >= 0 (of targets: the ones the loss counts).
static int check_ids(const GPT *m, const int *ids, int B, int T, int is_target) {
    int counted = 0;
    for (int i = 0; i < B * T; i++) {
        if (ids[i] >= m->cfg.V || (ids[i] < 0 && !is_target))
            fatal(EXIT_USAGE, "%s %d at batch row %d, position %d is outside the vocabulary "
                              "[0, %d): the data does not match model.vocab_size",
                  is_target ? "target" : "token", ids[i], i / T, i % T, m->cfg.V);
        counted += ids[i] >= 0;
    }
    return counted;
}

// The documents of a (B, T) batch: one starts at each row start and after each eot token
// inside the row. Writes the position of every token within its document to pos (B*T) and the
// document offsets over the flattened batch to cu (n_docs + 1); returns n_docs.
static int find_documents(const int *tokens, int B, int T, int eot, int *pos, int *cu) {
    int n = 0;
    for (int i = 0; i < B * T; i++) {
        const int t = i % T;
        if (t == 0 || tokens[i - 1] == eot) cu[n++] = i;
        pos[i] = i - cu[n - 1];
    }
    cu[n] = B * T;
    return n;
}

// gpt_check_batch, returning the number of counted targets (0 without targets).
static int check_batch(const GPT *m, const int *tokens, const int *targets, int B, int T) {
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        fatal(EXIT_USAGE, "gpt_forward: batch %d x %d does not fit the %d x %d the model was built "
                          "for", B, T, m->B, m->T);
    if (m->ring && T != m->T)
        fatal(EXIT_USAGE, "gpt_forward: under context parallelism every batch holds the %d local "
                          "tokens of each sequence, got %d", m->T, T);
    check_ids(m, tokens, B, T, 0);
    return targets ? check_ids(m, targets, B, T, 1) : 0;
}

void gpt_check_batch(const GPT *m, const int *tokens, const int *targets, int B, int T) {
    check_batch(m, tokens, targets, B, T);
}

// The forward up to the logits over the batch in m->tokens (tokens: its host copy, for the
// documents of doc_mask).
static void forward_logits(GPT *m, const int *tokens, int has_targets, int B, int T) {
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    const int N = B * T, C = g->C;
    m->n_docs = 0;
    m->pos = NULL;
    if (m->eot >= 0) {
        m->n_docs = find_documents(tokens, B, T, m->eot, m->doc_pos_host, m->cu_host);
        be->upload(be, m->doc_pos, m->doc_pos_host, (size_t)N * sizeof(int));
        be->upload(be, m->cu_seqlens, m->cu_host, (size_t)(m->n_docs + 1) * sizeof(int));
        m->pos = m->doc_pos;
    }
    if (m->ring) m->pos = m->ring_pos;

    const int train = has_targets && m->training;
    m->drop_attn = train && m->attn_dropout > 0.0f;
    m->drop_resid = train && m->resid_dropout > 0.0f;
    m->dropout_base = m->rng_step * sites_per_step(m);
    void *wpe = m->wpe_i >= 0 ? tensor_ptr(m, m->params, m->wpe_i) : NULL;
    be->embed_forward(be, m->encoded, m->tokens, m->pos, tensor_ptr(m, m->params, m->wte_i), wpe, B,
                      T, C);
    if (m->drop_resid) resid_dropout(m, m->encoded, (size_t)N * C, g->L, 0);
    const void *x = m->encoded;
    for (int l = 0; l < g->L; l++) {
        BlockActs *a = &m->acts[l];
        AttnParams p = layer_attn(m, a, B, T, l);
        block_forward(m, l, a, x, a->res_mlp, m->scratch, N, T, m->pos, &p, -1, m->drop_resid);
        x = a->res_mlp;
    }
    be->layernorm_forward(be, m->lnf, m->lnf_mean, m->lnf_rstd, x, tensor_ptr(m, m->params, m->lnf_i),
                          tensor_ptr(m, m->params, m->lnf_i + 1), N, C);
    m->last_B = B;
    m->last_T = T;
    m->logits_valid = 1;
    m->head_chunk = -1;
    m->has_targets = has_targets;
}

float gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T) {
    Backend *be = m->be;
    const int n_valid = check_batch(m, tokens, targets, B, T);
    const int N = B * T;
    m->tokens = m->own_tokens;
    m->targets = m->own_targets;
    be->upload(be, m->tokens, tokens, (size_t)N * sizeof(int));
    forward_logits(m, tokens, targets != NULL, B, T);
    if (!targets) return 0.0f;

    be->upload(be, m->targets, targets, (size_t)N * sizeof(int));
    head_forward(m, N);
    be->download(be, m->losses_host, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) sum += m->losses_host[i];
    m->n_valid = n_valid;
    m->loss_sum = sum;
    m->n_loss = m->n_valid;
    return m->n_valid ? (float)(sum / m->n_valid) : 0.0f;
}

int gpt_forward_async(GPT *m, const int *host, const int *dev, int B, int T, double *loss_acc) {
    const int N = B * T;
    const int n_valid = check_batch(m, host, host + N, B, T);
    if (m->eot >= 0 || m->ring)
        fatal(EXIT_RUNTIME, "gpt_forward_async: attention.doc_mask and context parallelism need "
                            "gpt_forward");
    m->tokens = (int *)dev;
    m->targets = (int *)dev + N;
    forward_logits(m, host, 1, B, T);
    m->n_valid = n_valid;
    m->n_loss = m->n_valid;
    m->loss_sum = NAN;   // on the device only
    head_forward(m, N);
    m->be->loss_mean_add(m->be, loss_acc, m->losses, m->targets, N, m->n_valid);
    return m->n_valid;
}

double gpt_loss_sum(const GPT *m, int *count) {
    *count = m->n_valid;
    return m->loss_sum;
}

void gpt_set_loss_tokens(GPT *m, long long n) { m->n_loss = n; }

int gpt_set_ring(GPT *m, const RingLink *link, char *err, size_t errlen) {
    const GPTConfig *g = &m->cfg;
    if (m->eot >= 0 || m->attn_dropout > 0.0f)
        return set_error(err, errlen, "context parallelism supports neither attention.doc_mask nor "
                                      "attention.dropout yet: set them to false and 0, or "
                                      "dist.context_parallel = 1");
    const AttnParams kind = {.impl = m->impl, .dtype = m->be->dtype};
    if (attn_runs_naive(&kind, m->be->device))
        return set_error(err, errlen, "context parallelism needs the flash attention: attention.impl = "
                                      "flash and, on the GPU, precision.dtype bf16 or fp16 (the naive "
                                      "attention, which fp32 runs on the GPU, materialises the whole "
                                      "score matrix and has no chunked backward)");
    if (m->T % 2 != 0 || (long long)m->T * link->size > g->maxT)
        return set_error(err, errlen, "context parallelism: %d ranks x %d local tokens must be an even "
                                      "split within model.max_seq_len (%d)", link->size, m->T, g->maxT);
    CHECK(!m->ring);
    m->ring = ring_attention_create(m->be, link, m->B, m->T, g->NH, g->NKV, g->HS);
    int *pos = xmalloc((size_t)m->B * m->T * sizeof(int));  // (B, T)
    for (int b = 0; b < m->B; b++)
        for (int t = 0; t < m->T; t++)
            pos[(size_t)b * m->T + t] = ring_global_pos(link->rank, link->size, m->T, t);
    m->ring_pos = balloc(m, (size_t)m->B * m->T * sizeof(int));
    m->be->upload(m->be, m->ring_pos, pos, (size_t)m->B * m->T * sizeof(int));
    free(pos);
    return 0;
}

void gpt_set_grad_ready_hook(GPT *m, GradReadyFn fn, void *ctx) {
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}

// Hands the gradients of tensors [first, first + count) (adjacent in the flat vector) to the
// grad-ready hook.
static void report_grads(GPT *m, int first, int count) {
    if (!m->grad_ready) return;
    const ParamTensor *a = &m->tensors[first], *b = &m->tensors[first + count - 1];
    m->grad_ready(m->grad_ready_ctx, a->offset, b->offset + b->numel - a->offset);
}

static void report_layer(GPT *m, int l) {
    report_grads(m, m->layer0_i + l * N_LAYER_TENSORS, N_LAYER_TENSORS);
}

// wpe, then wte: both are final only after the embedding backward (wte also carries the head).
static void report_embeddings(GPT *m) {
    if (m->wpe_i >= 0) report_grads(m, m->wpe_i, 1);
    report_grads(m, m->wte_i, 1);
}

void gpt_backward(GPT *m, float grad_scale) {
    if (!m->has_targets || !m->logits_valid)
        fatal(EXIT_RUNTIME, "gpt_backward needs a preceding gpt_forward with targets (each forward "
                            "allows one backward)");
    m->logits_valid = 0;
    // Every target ignored: no gradient, but every block is final. Under context parallelism
    // n_loss counts the whole ring's targets, so the ranks agree and the ring runs on every rank
    // (its keys carry gradient for the others' queries) unless none has a target.
    if (m->n_loss == 0) {
        report_grads(m, m->lnf_i, 2);
        for (int l = m->cfg.L - 1; l >= 0; l--)
            report_layer(m, l);
        report_embeddings(m);
        return;
    }
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    const int B = m->last_B, T = m->last_T, N = B * T, C = g->C;
    const size_t NC = (size_t)N * C * m->ds;
    void *w = m->params, *dw = m->grads;

    head_backward(m, N, (float)((double)grad_scale / (double)m->n_loss));
    be->fill_zero(be, m->dres, NC);
    const void *x_last = m->acts[g->L - 1].res_mlp;
    // Each LayerNorm backward also leaves a copy of the residual gradient in dtmp, through the
    // residual dropout mask of the branch below it, which consumes that copy (matmul_backward may
    // use it as scratch) while dres carries the residual path.
    DropMask below = resid_mask(m, g->L - 1, SITE_MLP);
    be->layernorm_backward(be, m->dres, m->dtmp, tensor_ptr(m, dw, m->lnf_i),
                           tensor_ptr(m, dw, m->lnf_i + 1), m->dln, x_last,
                           tensor_ptr(m, w, m->lnf_i), m->lnf_mean, m->lnf_rstd, N, C, &below);
    report_grads(m, m->lnf_i, 2);

    for (int l = g->L - 1; l >= 0; l--) {
        BlockActs *a = &m->acts[l];
        const void *x_in = l == 0 ? m->encoded : m->acts[l - 1].res_mlp;
        AttnParams p = layer_attn(m, a, B, T, l);
        if (m->recompute == RECOMPUTE_BLOCK) {
            // dfch is free until the MLP backward below; the block output itself is not needed.
            block_forward(m, l, a, x_in, m->dfch, m->scratch, N, T, m->pos, &p, -1,
                          m->drop_resid);
        } else if (m->recompute == RECOMPUTE_ATTN_GELU) {
            attention_forward(m, &p, 0);
            be->matmul_forward(be, a->fch, a->fch_pre, a->ln2, layer_ptr(m, w, l, FC_W),
                               layer_ptr(m, w, l, FC_B), N, C, 4 * C, EPI_GELU);
        }
        // MLP branch, from dtmp.
        be->matmul_backward(be, m->dfch, layer_ptr(m, dw, l, FCPROJ_W), layer_ptr(m, dw, l, FCPROJ_B),
                            m->dtmp, NULL, a->fch, layer_ptr(m, w, l, FCPROJ_W), N, 4 * C, C, EPI_NONE);
        be->matmul_backward(be, m->dln, layer_ptr(m, dw, l, FC_W), layer_ptr(m, dw, l, FC_B), m->dfch,
                            a->fch_pre, a->ln2, layer_ptr(m, w, l, FC_W), N, C, 4 * C, EPI_GELU);
        below = resid_mask(m, l, SITE_PROJ);
        be->layernorm_backward(be, m->dres, m->dtmp, layer_ptr(m, dw, l, LN2_W),
                               layer_ptr(m, dw, l, LN2_B), m->dln, a->res_attn,
                               layer_ptr(m, w, l, LN2_W), a->ln2_mean, a->ln2_rstd, N, C, &below);
        // Attention branch, from dtmp.
        be->matmul_backward(be, m->datty, layer_ptr(m, dw, l, PROJ_W), layer_ptr(m, dw, l, PROJ_B),
                            m->dtmp, NULL, a->atty, layer_ptr(m, w, l, PROJ_W), N, C, C, EPI_NONE);
        attn_fused_qkv_grads(&p, m->dqkv, m->datty, m->ds);
        attention_backward(m, &p);
        if (m->rope) be->rope_backward(be, m->dqkv, m->rope, m->pos, N, T, g->NH, g->NKV, g->HS);
        be->matmul_backward(be, m->dln, layer_ptr(m, dw, l, QKV_W), layer_ptr(m, dw, l, QKV_B), m->dqkv,
                            NULL, a->ln1, layer_ptr(m, w, l, QKV_W), N, C, m->OCq, EPI_NONE);
        if (l > 0) below = resid_mask(m, l - 1, SITE_MLP);   // layer l - 1's MLP branch
        be->layernorm_backward(be, m->dres, l > 0 ? m->dtmp : NULL, layer_ptr(m, dw, l, LN1_W),
                               layer_ptr(m, dw, l, LN1_B), m->dln, x_in, layer_ptr(m, w, l, LN1_W),
                               a->ln1_mean, a->ln1_rstd, N, C, l > 0 ? &below : NULL);
        report_layer(m, l);
    }
    if (m->drop_resid) resid_dropout(m, m->dres, (size_t)N * C, g->L, 0);
    void *dwpe = m->wpe_i >= 0 ? tensor_ptr(m, dw, m->wpe_i) : NULL;
    be->embed_backward(be, tensor_ptr(m, dw, m->wte_i), dwpe, m->dres, m->tokens, m->pos, B, T, C, g->Vp,
                       g->maxT);
    report_embeddings(m);
}

void gpt_losses_f32(GPT *m, float *host) {
    if (!m->has_targets) fatal(EXIT_RUNTIME, "gpt_losses_f32: the last forward had no targets");
    memcpy(host, m->losses_host, (size_t)m->last_B * m->last_T * sizeof(float));
}

void gpt_logits_f32(GPT *m, float *host) {
    if (!m->logits_valid)
        fatal(EXIT_RUNTIME, "gpt_logits_f32: no logits (no forward yet, or backward consumed them)");
    const int N = m->last_B * m->last_T, V = m->cfg.V, Vp = m->cfg.Vp;
    float *chunk = xmalloc((size_t)min_int(m->head_rows, N) * Vp * sizeof(float));   // (rows, Vp)
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        const int n = min_int(m->head_rows, N - r0);
        if (m->head_chunk != r0) head_logits(m, r0, n);
        m->be->download_f32(m->be, chunk, m->logits, (size_t)n * Vp);
        for (int i = 0; i < n; i++)
            memcpy(host + (size_t)(r0 + i) * V, chunk + (size_t)i * Vp, (size_t)V * sizeof(float));
    }
    free(chunk);
}

// Backend bytes of one token's BlockActs (alloc_block).
static size_t block_bytes(const GPT *m) {
    const size_t C = m->cfg.C;
    return (13 * C + m->OCq) * m->ds + (4 + (size_t)m->cfg.NH) * sizeof(float);
}

// Bytes of the decode buffers for B sequences of T positions (in double: B may be absurd): per
// sequence the KV cache and one step's activations, then the prefill chunk's activations (of
// pre rows) and the token ids.
static double decode_bytes(const GPT *m, int B, int T, int pre_rows) {
    const GPTConfig *g = &m->cfg;
    const size_t C = g->C, ds = m->ds;
    const size_t kv = (size_t)g->L * 2 * g->NKV * (size_t)T * g->HS * ds;
    const size_t seq = kv + block_bytes(m) + (3 * C + g->Vp) * ds + 2 * sizeof(float);
    const size_t pre = (size_t)pre_rows * (block_bytes(m) + 2 * C * ds);
    const double ids = 2.0 * (B > pre_rows ? B : pre_rows) * sizeof(int);
    return (double)B * seq + pre + ids;
}

int gpt_decode_reserve(GPT *m, int B, int T, char *err, size_t errlen) {
    const GPTConfig *g = &m->cfg;
    if (m->kv) {
        if (B == m->dec_B && T <= m->kv_T) return 0;
        return set_error(err, errlen, "decode: the cache holds %d sequences of %d positions, asked "
                                      "for %d of %d", m->dec_B, m->kv_T, B, T);
    }
    if (B < 1) return set_error(err, errlen, "decode: %d sequences: need at least 1", B);
    if (T < 1 || T > g->maxT)
        return set_error(err, errlen, "decode: a cache of %d positions: need 1 to model.max_seq_len "
                                      "(%d)", T, g->maxT);
    const int pre_cap = m->pre_cap < T ? m->pre_cap : T;   // a prefill chunk never exceeds T
    const double need = decode_bytes(m, B, T, pre_cap);
    size_t avail = 0, used = 0;
    const int device = m->be->memory(m->be, &avail, &used);   // else host memory: all of it
    if (!device) avail = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    if (need > (double)avail)
        return set_error(err, errlen, "decode: %d sequences of up to %d positions need %.2f GiB for "
                                      "the KV cache and activations, more than the %.2f GiB %s: use fewer",
                         B, T, need / 1073741824.0, avail / 1073741824.0,
                         device ? "free on the GPU" : "of host memory");
    size_t C = g->C, ds = m->ds;
    m->dec_B = B;
    m->kv_T = T;
    m->pre_cap = pre_cap;
    if (m->pre_rows > pre_cap) m->pre_rows = pre_cap;
    alloc_block(m, &m->dec, B, 1);
    m->dec_x = balloc(m, B * C * ds);
    m->dec_scratch = balloc(m, B * C * ds);
    m->dec_lnf = balloc(m, B * C * ds);
    m->dec_logits = balloc(m, B * (size_t)g->Vp * ds);
    m->dec_lnf_mean = balloc(m, B * sizeof(float));
    m->dec_lnf_rstd = balloc(m, B * sizeof(float));
    alloc_block(m, &m->pre, 1, m->pre_cap);
    m->pre_x = balloc(m, (size_t)m->pre_cap * C * ds);
    m->pre_scratch = balloc(m, (size_t)m->pre_cap * C * ds);
    m->ids_cap = B > m->pre_cap ? B : m->pre_cap;
    m->ids = balloc(m, 2 * (size_t)m->ids_cap * sizeof(int));
    m->ids_host = xcalloc(2 * (size_t)m->ids_cap, sizeof(int));
    if (B > 1 && g->V < g->Vp) m->dec_logits_host = xmalloc((size_t)B * g->Vp * sizeof(float));
    m->kv = balloc(m, (size_t)B * g->L * 2 * g->NKV * (size_t)T * g->HS * ds);
    return 0;
}

int gpt_decode_positions(const GPT *m) { return m->kv ? m->kv_T : m->cfg.maxT; }

void gpt_decode_seek(GPT *m, int pos) {
    if (!m->kv || pos < 0 || pos >= m->kv_T)
        fatal(EXIT_USAGE, "decode: seek to position %d needs the decode buffers and 0 <= pos < "
                          "the %d positions of the cache", pos, m->kv_T);
    m->kv_len = pos;
}

void gpt_set_decode_split(GPT *m, int on) { m->decode_unsplit = !on; }

void gpt_decode_step(GPT *m, int token, int pos, float *logits_out) {
    gpt_decode_batch(m, &token, 1, pos, logits_out);
}

// The checks of a decode call feeding n_tokens tokens at n positions per sequence from pos, for
// B sequences (exit 2 with a message), and the decode buffers for B (of max_seq_len positions
// when none were reserved).
static void decode_begin(GPT *m, const int *tokens, int n_tokens, int n, int B, int pos) {
    const GPTConfig *g = &m->cfg;
    char err[ERR_LEN];
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= g->V)
            fatal(EXIT_USAGE, "decode: token %d is outside the vocabulary [0, %d)", tokens[i], g->V);
    if (n < 1 || pos < 0 || pos + (int64_t)n > g->maxT)
        fatal(EXIT_USAGE, "decode: %d position(s) from %d do not fit model.max_seq_len (%d)", n, pos,
              g->maxT);
    if (pos > m->kv_len)
        fatal(EXIT_RUNTIME, "decode: position %d follows %d cached positions; feed positions "
                            "0, 1, 2, ... in order", pos, m->kv_len);
    if (gpt_decode_reserve(m, B, m->kv ? m->kv_T : g->maxT, err, sizeof err) != 0)
        fatal(EXIT_USAGE, "%s", err);
    if (pos + (int64_t)n > m->kv_T)
        fatal(EXIT_USAGE, "decode: %d position(s) from %d do not fit the %d positions the cache "
                          "was reserved for (gpt_decode_reserve)", n, pos, m->kv_T);
}

// n tokens and their positions pos + i * step into m->ids (tokens, then positions), one upload.
static void upload_ids(GPT *m, const int *tokens, int n, int pos, int step) {
    for (int i = 0; i < n; i++) {
        m->ids_host[i] = tokens[i];
        m->ids_host[n + i] = pos + i * step;
    }
    m->be->upload(m->be, m->ids, m->ids_host, 2 * (size_t)n * sizeof(int));
}

// Layer l's attention for decoding the (B, T) tokens of `a` at positions pos .. pos + T - 1
// against the cache of the first B sequences: T queries against their pos + T cached positions
// (bottom-right aligned: the queries are the last positions, so causal masking hides the later
// ones of the chunk, and a window still applies); on sparse layers the blocks of those queries'
// blocks.
static AttnParams decode_attn(GPT *m, BlockActs *a, int B, int T, int pos, int l) {
    const GPTConfig *g = &m->cfg;
    const int64_t head = (int64_t)m->kv_T * g->HS;   // cache elements per (sequence, head)
    void *keys = at(m->kv, (size_t)2 * l * m->dec_B * g->NKV * head, m->ds);   // (B, NKV, kv_T, HS)
    AttnParams p = attn_params(m, a, B, T, l);
    p.T_k = pos + T;
    p.k = keys;
    p.v = at(keys, (size_t)m->dec_B * g->NKV * head, m->ds);
    p.k_st = p.v_st = (AttnStrides){g->NKV * head, g->HS, head};
    sparse_lists_apply(m->sparse, &p, l);
    return p;
}

// The next-token logits of the B rows x (B, C) into logits_out (B, V) fp32 host, in one
// download (one wait for the device): straight into logits_out where its rows are those of
// the (B, Vp) device buffer, else through the host staging rows.
static void decode_logits(GPT *m, const void *x, int B, float *logits_out) {
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    be->layernorm_forward(be, m->dec_lnf, m->dec_lnf_mean, m->dec_lnf_rstd, x,
                          tensor_ptr(m, m->params, m->lnf_i), tensor_ptr(m, m->params, m->lnf_i + 1),
                          B, g->C);
    be->matmul_forward(be, m->dec_logits, NULL, m->dec_lnf, tensor_ptr(m, m->params, m->wte_i), NULL,
                       B, g->C, g->Vp, EPI_NONE);
    if (B == 1 || g->V == g->Vp) {
        be->download_f32(be, logits_out, m->dec_logits, (size_t)B * g->V);
        return;
    }
    be->download_f32(be, m->dec_logits_host, m->dec_logits, (size_t)B * g->Vp);
    for (int b = 0; b < B; b++)
        memcpy(logits_out + (size_t)b * g->V, m->dec_logits_host + (size_t)b * g->Vp,
               (size_t)g->V * sizeof(float));
}

static void *wpe_ptr(GPT *m) { return m->wpe_i >= 0 ? tensor_ptr(m, m->params, m->wpe_i) : NULL; }

void gpt_decode_batch(GPT *m, const int *tokens, int B, int pos, float *logits_out) {
    decode_begin(m, tokens, B, 1, B, pos);
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    upload_ids(m, tokens, B, pos, 0);
    const int *dec_pos = m->ids + B;
    be->embed_forward(be, m->dec_x, m->ids, dec_pos, tensor_ptr(m, m->params, m->wte_i), wpe_ptr(m), B, 1,
                      g->C);
    for (int l = 0; l < g->L; l++) {
        AttnParams p = decode_attn(m, &m->dec, B, 1, pos, l);
        block_forward(m, l, &m->dec, m->dec_x, m->dec_x, m->dec_scratch, B, 1, dec_pos, &p, pos, 0);
    }
    decode_logits(m, m->dec_x, B, logits_out);
    m->kv_len = pos + 1;
}

// Rows of the prefill chunk from position pos of a prompt ending at end: up to pre_rows, fewer
// where the attention is materialised (its two (NH, rows, T_k) fp32 score matrices within
// PREFILL_NAIVE_BYTES). A chunk's query blocks (ATTN_SPARSE_BLOCK rows from its first) must each
// lie within one of training's, so that a sparse layer reads their blocks: a chunk from inside
// a block ends at that block's end, and one from a block's start ends on a block's start unless
// the prompt or a chunk shorter than a block ends first.
static int prefill_rows(const GPT *m, int pos, int end) {
    int rows = end - pos < m->pre_rows ? end - pos : m->pre_rows;
    const AttnParams kind = {.impl = m->impl, .dtype = m->be->dtype};
    if (m->impl == ATTN_IMPL_NAIVE || attn_runs_naive(&kind, m->be->device)) {
        const size_t per_row = 2 * (size_t)m->cfg.NH * (size_t)end * sizeof(float);
        const size_t most = PREFILL_NAIVE_BYTES / per_row;
        if ((size_t)rows > most) rows = most > 0 ? (int)most : 1;
    }
    const int into = pos % ATTN_SPARSE_BLOCK, cut = (pos + rows) / ATTN_SPARSE_BLOCK * ATTN_SPARSE_BLOCK;
    if (into > 0 && rows > ATTN_SPARSE_BLOCK - into) rows = ATTN_SPARSE_BLOCK - into;
    else if (into == 0 && pos + rows < end && cut > pos) rows = cut - pos;
    return rows;
}

// The cached positions [pos, pos + n) of sequence 0 into sequences 1 .. dec_B - 1.
static void replicate_cache(GPT *m, int pos, int n) {
    const GPTConfig *g = &m->cfg;
    const size_t ds = m->ds, head = (size_t)m->kv_T * g->HS, seq = g->NKV * head;
    for (int lk = 0; lk < 2 * g->L; lk++) {   // layer l's keys, then its values
        const char *src = at(m->kv, (size_t)lk * m->dec_B * seq + (size_t)pos * g->HS, ds);
        for (int b = 1; b < m->dec_B; b++)
            m->be->copy_2d(m->be, (char *)src + b * seq * ds, head * ds, src, head * ds,
                           (size_t)n * g->HS * ds, g->NKV);
    }
}

void gpt_decode_prefill(GPT *m, const int *tokens, int n, int B, int pos, float *logits_out) {
    decode_begin(m, tokens, n, n, B, pos);
    Backend *be = m->be;
    const GPTConfig *g = &m->cfg;
    const size_t C = g->C;
    int rows = 0;
    for (int s = pos; s < pos + n; s += rows) {
        rows = prefill_rows(m, s, pos + n);
        upload_ids(m, tokens + (s - pos), rows, s, 1);
        be->embed_forward(be, m->pre_x, m->ids, m->ids + rows, tensor_ptr(m, m->params, m->wte_i),
                          wpe_ptr(m), 1, rows, (int)C);
        for (int l = 0; l < g->L; l++) {
            AttnParams p = decode_attn(m, &m->pre, 1, rows, s, l);
            block_forward(m, l, &m->pre, m->pre_x, m->pre_x, m->pre_scratch, rows, rows, m->ids + rows, &p,
                          s, 0);
        }
    }
    replicate_cache(m, pos, n);
    m->kv_len = pos + n;
    decode_logits(m, at(m->pre_x, (size_t)(rows - 1) * C, m->ds), 1, logits_out);
    for (int b = 1; b < B; b++)
        memcpy(logits_out + (size_t)b * g->V, logits_out, (size_t)g->V * sizeof(float));
}
