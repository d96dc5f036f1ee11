// ring_hub: an in-memory RingLink for the tests that run several ring ranks as threads of one
// process (tests/ring_harness.h, tests/gpu/test_ring_model_gpu.c), each rank with its own backend.
#pragma once
#include <pthread.h>
#include <string.h>

#include "common/check.h"
#include "model/backend.h"
#include "model/ring_attention.h"

enum { HUB_MAXP = 4, HUB_MAXQ = 8 };

// The in-memory ring: start() queues a rank's (send to dst, receive from src) pair; wait()
// finishes the rank's own queued work, meets every rank at a barrier, copies into each of its
// receives the matching send queued for it (the k-th receive from src takes src's k-th send to
// this rank), and meets again so that no send buffer changes before every copy from it is done.
typedef struct {
    pthread_barrier_t bar;
    int P;
    struct {
        const void *send;
        void *recv;
        int dst, src;
        size_t bytes;
    } q[HUB_MAXP][HUB_MAXQ];
    int n[HUB_MAXP];
    int sent[HUB_MAXP];  // blocks each rank has sent, over the whole run
} Hub;

typedef struct {
    Hub *hub;
    Backend *be;
    int rank;
} Port;

static inline void hub_start(void *ctx, const void *send, int dst, void *recv, int src, size_t bytes) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    CHECK(h->n[pt->rank] < HUB_MAXQ && (send || recv));
    h->q[pt->rank][h->n[pt->rank]++] = (typeof(h->q[0][0])){send, recv, dst, src, bytes};
    h->sent[pt->rank] += send != NULL;
}

static inline void hub_wait(void *ctx) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    const int me = pt->rank;
    pt->be->synchronize(pt->be);
    pthread_barrier_wait(&h->bar);
    int taken[HUB_MAXP] = {0};  // sends of each rank to this one already matched
    for (int i = 0; i < h->n[me]; i++) {
        if (!h->q[me][i].recv) continue;
        const int src = h->q[me][i].src;
        int k = 0, found = -1;
        for (int j = 0; j < h->n[src] && found < 0; j++)
            if (h->q[src][j].send && h->q[src][j].dst == me && k++ == taken[src]) found = j;
        CHECK(found >= 0 && h->q[src][found].bytes == h->q[me][i].bytes);
        taken[src]++;
        pt->be->copy(pt->be, h->q[me][i].recv, h->q[src][found].send, h->q[me][i].bytes);
    }
    pt->be->synchronize(pt->be);
    pthread_barrier_wait(&h->bar);
    h->n[me] = 0;
}


static inline void hub_init(Hub *h, int P) {
    memset(h, 0, sizeof *h);
    h->P = P;
    pthread_barrier_init(&h->bar, NULL, (unsigned)P);
}

// Blocks sent by all ranks together since hub_init.
static inline int hub_sent(const Hub *h) {
    int n = 0;
    for (int r = 0; r < h->P; r++) n += h->sent[r];
    return n;
}

static inline RingLink hub_link(Port *port) {
    return (RingLink){.ctx = port, .rank = port->rank, .size = port->hub->P, .start = hub_start,
                      .wait = hub_wait};
}
