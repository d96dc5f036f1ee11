// context_parallel: the groups, the ring link over the group's comm and the zigzag slicing of
// whole sequences (trainer/context_parallel.h).
#include "trainer/context_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

struct ContextParallel {
    CpLayout layout;
    Comm *group;      // the CP ranks of this rank's group, ranked by ring rank
    RingLink link;    // ctx: this struct
};

int cp_layout(const Config *c, int rank, int world, CpLayout *out, char *err, size_t errlen) {
    const int cp = c->dist.context_parallel;
    if (world % cp != 0)
        return set_error(err, errlen,
                         "dist.context_parallel = %d does not divide the %d ranks of this launch: "
                         "launch a multiple of %d ranks (world = data-parallel size x "
                         "dist.context_parallel) or set dist.context_parallel to a divisor of %d",
                         cp, world, cp, world);
    *out = (CpLayout){.cp = cp, .cp_rank = rank % cp, .dp = world / cp, .dp_rank = rank / cp};
    return 0;
}

int cp_local_len(const Config *c) { return c->train.seq_len / c->dist.context_parallel; }

static int link_start(void *ctx, const void *send, size_t send_bytes, int dst, void *recv,
                      size_t recv_bytes, int src) {
    ContextParallel *cp = ctx;
    return cp->group->sendrecv_start(cp->group, send, send_bytes, dst, recv, recv_bytes, src);
}

static void link_wait(void *ctx, int handle) {
    ContextParallel *cp = ctx;
    cp->group->sendrecv_wait(cp->group, handle);
}

int cp_open(Comm *world, const Config *c, GPT *m, ContextParallel **out, char *err, size_t errlen) {
    *out = NULL;
    if (c->dist.context_parallel == 1) return 0;
    CpLayout lay;
    if (cp_layout(c, world->rank, world->world, &lay, err, errlen) != 0) return -1;
    if (!world->split || !world->sendrecv_start)
        return set_error(err, errlen, "dist.context_parallel = %d: the %s communicator has no "
                                      "point-to-point exchange yet: set dist.context_parallel = 1",
                         lay.cp, world->name);
    ContextParallel *cp = xcalloc(1, sizeof *cp);
    cp->layout = lay;
    char why[ERR_LEN];
    cp->group = world->split(world, lay.dp_rank, lay.cp_rank, why, sizeof why);
    if (!cp->group) {
        free(cp);
        return set_error(err, errlen, "dist.context_parallel = %d: %s", lay.cp, why);
    }
    CHECK(cp->group->world == lay.cp && cp->group->rank == lay.cp_rank);
    cp->link = (RingLink){.ctx = cp, .rank = lay.cp_rank, .size = lay.cp, .start = link_start,
                          .wait = link_wait};
    if (gpt_set_ring(m, &cp->link, err, errlen) != 0) {
        cp_close(cp);
        return -1;
    }
    *out = cp;
    return 0;
}

void cp_close(ContextParallel *cp) {
    if (!cp) return;
    comm_close(cp->group);
    free(cp);
}

const CpLayout *cp_get_layout(const ContextParallel *cp) { return &cp->layout; }

void cp_take_local(const ContextParallel *cp, const int *full, int *local, int B, int T) {
    const int n = cp->layout.cp, TL = T / n;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TL; t++)
            local[(size_t)b * TL + t] =
                full[(size_t)b * T + ring_global_pos(cp->layout.cp_rank, n, TL, t)];
}

void cp_group_sum(ContextParallel *cp, double *buf, size_t n) {
    cp->group->allreduce_host_f64(cp->group, buf, n);
}
