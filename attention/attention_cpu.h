// attention_cpu: internals shared by the CPU reference implementations of attention/attention.h
// (not a public API: callers use attn_forward_cpu / attn_backward_cpu).
#pragma once
#include "attention/attention.h"

// Element (b, t, h, 0) of a strided fp32 tensor; the HS elements from there are contiguous.
static inline const float *attn_cpu_row(const void *base, AttnStrides st, int b, int t, int h) {
    return (const float *)base + (int64_t)b * st.batch + (int64_t)t * st.row + (int64_t)h * st.head;
}
static inline float *attn_cpu_row_mut(void *base, AttnStrides st, int b, int t, int h) {
    return (float *)base + (int64_t)b * st.batch + (int64_t)t * st.row + (int64_t)h * st.head;
}

// FlashAttention-2 on the CPU: tiled, online softmax, O(T) extra memory per (b, h).
// Each returns 0, or -1 when a thread's scratch memory could not be allocated.
int attn_cpu_flash_forward(const AttnParams *p);
int attn_cpu_flash_backward(const AttnParams *p);
// The materialised (T_q, T_k) score matrix per (b, h): the simple reference.
int attn_cpu_naive_forward(const AttnParams *p);
int attn_cpu_naive_backward(const AttnParams *p);
