// attention_cpu: the public CPU entry points; p->impl picks the implementation.
#include "attention/attention.h"
#include "attention/attention_cpu.h"

int attn_forward_cpu(const AttnParams *p) {
    return p->impl == ATTN_IMPL_NAIVE ? attn_cpu_naive_forward(p) : attn_cpu_flash_forward(p);
}

int attn_backward_cpu(const AttnParams *p) {
    return p->impl == ATTN_IMPL_NAIVE ? attn_cpu_naive_backward(p) : attn_cpu_flash_backward(p);
}
