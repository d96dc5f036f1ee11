// decode_plan: the split-KV kernel's cut of a decode problem (attention/decode_plan.h).
#include "attention/decode_plan.h"

#include "attention/mask.h"
#include "attention/route.h"

// Query rows per block: the group's rows rounded up to 1, 4 or 8.
static int rows_per_block(const AttnParams *p) {
    const int rows = p->NH / p->NKV * p->T_q;
    return rows <= 1 ? 1 : rows <= 4 ? 4 : 8;
}

static int row_chunks(const AttnParams *p) {
    const int R = rows_per_block(p);
    return (p->NH / p->NKV * p->T_q + R - 1) / R;
}

// Splits that give the problem's blocks DECODE_BLOCKS_PER_SM per multiprocessor, whatever T_k.
static int fill_splits(const AttnParams *p, int sms) {
    const int64_t blocks = (int64_t)p->B * p->NKV * row_chunks(p);
    const int64_t splits = ((int64_t)sms * DECODE_BLOCKS_PER_SM + blocks - 1) / blocks;
    return (int)(splits < 1 ? 1 : splits);
}

// Keys per split (a multiple of DECODE_KEYS) for a given split count over n keys.
static int split_keys(int n, int splits) {
    const int per = (n + splits - 1) / splits;
    return (per + DECODE_KEYS - 1) / DECODE_KEYS * DECODE_KEYS;
}

// The split count: fill_splits, but no split under DECODE_MIN_SPLIT keys (a short cache needs
// few splits, and every part adds a row to the merge).
DecodePlan decode_plan(const AttnParams *p, int sms) {
    DecodePlan d = {0, 0, 0, 0, 0, 0};
    if (!attn_route(p, DEVICE_CUDA).split) return d;
    // Rows' ranges are monotone in i (mask.h), so the union is the first row's lo to the last
    // row's hi (the same for every batch row: no documents here).
    d.k_begin = attn_key_range(p, 0, 0).lo;
    d.k_end = attn_key_range(p, 0, p->T_q - 1).hi;
    if (d.k_end < d.k_begin) d.k_end = d.k_begin;
    d.rows = rows_per_block(p);
    d.row_chunks = row_chunks(p);
    const int n = d.k_end - d.k_begin;
    int splits = fill_splits(p, sms < DECODE_MAX_SMS ? sms : DECODE_MAX_SMS);
    const int most = (n + DECODE_MIN_SPLIT - 1) / DECODE_MIN_SPLIT;
    if (splits > most) splits = most < 1 ? 1 : most;
    // Round the split size to whole warp steps, then drop the splits that would start past the
    // end (never more splits than before).
    d.keys_per_split = split_keys(n, splits);
    if (d.keys_per_split > 0) splits = (n + d.keys_per_split - 1) / d.keys_per_split;
    d.splits = splits < 1 ? 1 : splits;
    return d;
}

// decode_plan's split count never exceeds fill_splits at its multiprocessor count, which is
// at most DECODE_MAX_SMS.
size_t decode_workspace_bytes(const AttnParams *p) {
    if (!attn_route(p, DEVICE_CUDA).split) return 0;
    return (size_t)p->B * p->NH * p->T_q * fill_splits(p, DECODE_MAX_SMS) * DECODE_WARPS * (p->HS + 1) *
           sizeof(float);
}
