// merge_cpu: the exact combination of two partial attention results over disjoint key sets of
// the same queries (attention.h, attn_merge_cpu), in fp32.
//
// Each side is out_s = sum_j exp(s_j - lse_s) v_j over its keys, so with lse = log(exp(lse_acc)
// + exp(lse_part)) the union's output is out_acc * exp(lse_acc - lse) + out_part * exp(lse_part
// - lse). lse is formed from the larger side down, max + log1p(exp(min - max)), so neither exp
// overflows and equal inputs lose no bits; the weights then are exp(lse_s - lse) <= 1.
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_cpu.h"
#include "attention/mask.h"

void attn_merge_cpu(const AttnParams *acc, const AttnParams *part) {
    const int HS = acc->HS;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < acc->B; b++)
        for (int h = 0; h < acc->NH; h++) {
            float *la = acc->lse + attn_lse_offset(acc, b, h);
            const float *lp = part->lse + attn_lse_offset(part, b, h);
            for (int i = 0; i < acc->T_q; i++) {
                const float a = la[i], p = lp[i];
                // +inf marks a row with no visible key in that set: it adds nothing.
                if (p == INFINITY) continue;
                float *o = attn_cpu_row_mut(acc->out, acc->o_st, b, i, h);
                const float *op = attn_cpu_row(part->out, part->o_st, b, i, h);
                if (a == INFINITY) {
                    for (int d = 0; d < HS; d++) o[d] = op[d];
                    la[i] = p;
                    continue;
                }
                const float hi = a > p ? a : p, lo = a > p ? p : a;
                const float lse = hi + log1pf(expf(lo - hi));
                const float wa = expf(a - lse), wp = expf(p - lse);
                for (int d = 0; d < HS; d++) o[d] = o[d] * wa + op[d] * wp;
                la[i] = lse;
            }
        }
}
