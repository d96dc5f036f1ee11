// route: the one table of what each CUDA attention path takes (attention/route.h).
#include "attention/route.h"

#include "attention/mask.h"

// What the paths differ on: one bit per feature of a problem.
enum {
    F_IMPL_NAIVE = 1 << 0,   // impl naive asked for
    F_FP32 = 1 << 1,         // dtype fp32
    F_ALIBI = 1 << 2,
    F_DROPOUT = 1 << 3,
    F_SOFTCAP = 1 << 4,
    F_SPARSE = 1 << 5,       // a block mask
    F_DOCS = 1 << 6,         // packed documents (cu_seqlens)
    F_HS = 1 << 7,           // a head size other than 64 and 128
    F_MANY_Q = 1 << 8,       // more than ATTN_DECODE_MAX_TQ queries
};

// Per feature, whether each path takes a problem that has it (1) or sends it elsewhere (0).
// flash: the tensor-core kernels at all (else the naive path runs); plain: their instance that
// evaluates none of the optional features (else the feature instance runs); split: attn_decode's
// split-KV kernel (else attn_forward's path runs). A head size other than 64 and 128 stays with
// flash, whose kernel choice refuses it with a message that offers impl naive; the flash kernels'
// own refusals (softcap on the sm80 family) are the kernel choice's too.
static const struct {
    unsigned feature;
    unsigned char flash, plain, split;
} ROUTES[] = {
    //                 flash plain split
    {F_IMPL_NAIVE,     0,    0,    0},
    {F_FP32,           0,    0,    0},
    {F_ALIBI,          1,    0,    1},
    {F_DROPOUT,        1,    0,    0},
    {F_SOFTCAP,        1,    0,    0},
    {F_SPARSE,         1,    0,    0},
    {F_DOCS,           1,    1,    0},
    {F_HS,             1,    1,    0},
    {F_MANY_Q,         1,    1,    0},
};

static unsigned features(const AttnParams *p) {
    unsigned f = 0;
    if (p->impl == ATTN_IMPL_NAIVE) f |= F_IMPL_NAIVE;
    if (p->dtype == DTYPE_F32) f |= F_FP32;
    if (p->alibi_slopes) f |= F_ALIBI;
    if (p->dropout_p > 0.0f) f |= F_DROPOUT;
    if (p->softcap > 0.0f) f |= F_SOFTCAP;
    if (attn_sparse(p)) f |= F_SPARSE;
    if (p->cu_seqlens) f |= F_DOCS;
    if (p->HS != 64 && p->HS != 128) f |= F_HS;
    if (p->T_q > ATTN_DECODE_MAX_TQ) f |= F_MANY_Q;
    return f;
}

AttnRoute attn_route(const AttnParams *p, Device dev) {
    const unsigned f = features(p);
    int flash = 1, plain = 1, split = 1;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (f & ROUTES[i].feature) {
            flash &= ROUTES[i].flash;
            plain &= ROUTES[i].plain;
            split &= ROUTES[i].split;
        }
    const int cuda = dev == DEVICE_CUDA;
    return (AttnRoute){.naive = cuda && !flash, .extras = !plain, .split = cuda && flash && split};
}
