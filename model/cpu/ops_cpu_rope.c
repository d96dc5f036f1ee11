// ops_cpu_rope: the CPU backend's rotary position embedding (Backend.rope_forward and
// rope_backward) in fp32, in place on the query and key heads of the fused qkv buffer. Both
// directions are one rotation loop; backward turns by the opposite angle, the transpose.
#include "model/cpu/ops_cpu.h"

// Rotates the first NH + NKV heads of every row of x (N, (NH + 2*NKV) * HS) by the table's angle
// times sin_sign (+1 forward, -1 backward).
static void rope_rotate(float *x, const float *table, const int *pos, int N, int T, int NH, int NKV,
                        int HS, float sin_sign) {
    const int half = HS / 2, OC = (NH + 2 * NKV) * HS;
    #pragma omp parallel for schedule(static) if ((size_t)N * (NH + NKV) * HS >= CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *cs = table + (size_t)(pos ? pos[i] : i % T) * HS;   // (HS/2, 2)
        for (int h = 0; h < NH + NKV; h++) {
            float *v = x + (size_t)i * OC + (size_t)h * HS;   // (HS)
            for (int d = 0; d < half; d++) {
                const float c = cs[2 * d], s = sin_sign * cs[2 * d + 1];
                const float a = v[d], b = v[d + half];
                v[d] = a * c - b * s;
                v[d + half] = b * c + a * s;
            }
        }
    }
}

void cpu_rope_forward(Backend *be, void *qkv, const float *table, const int *pos, int N, int T,
                      int NH, int NKV, int HS) {
    rope_rotate(qkv, table, pos, N, T, NH, NKV, HS, 1.0f);
}

void cpu_rope_backward(Backend *be, void *dqkv, const float *table, const int *pos, int N, int T,
                       int NH, int NKV, int HS) {
    rope_rotate(dqkv, table, pos, N, T, NH, NKV, HS, -1.0f);
}
