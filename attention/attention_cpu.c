// attention_cpu: the public CPU entry points; p->impl picks the implementation.
#include "attention/attention.h"
#include "attention/attention_cpu.h"

void attn_forward_cpu(const AttnParams *p) {
    if (p->impl == ATTN_IMPL_NAIVE) attn_cpu_naive_forward(p);
    else attn_cpu_flash_forward(p);
}

void attn_backward_cpu(const AttnParams *p) {
    if (p->impl == ATTN_IMPL_NAIVE) attn_cpu_naive_backward(p);
    else attn_cpu_flash_backward(p);
}
