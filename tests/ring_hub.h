// ring_hub: an in-memory RingLink for the tests that run several ring ranks as threads of one
// process (tests/ring_harness.h, tests/gpu/test_ring_model_gpu.c), each rank with its own backend.
#pragma once
#include <pthread.h>
#include <string.h>

#include "common/check.h"
#include "model/backend.h"
#include "model/ring_attention.h"

enum { HUB_MAXP = 8, HUB_MAXQ = 4 };  // ranks; exchanges in flight per rank (RingLink's limit)

// One started exchange of a rank.
typedef struct {
    const void *send;
    void *recv;
    int dst, src;
    size_t send_bytes, recv_bytes;
    int send_seq, recv_seq;  // its send's place among this rank's sends to dst, its receive's
                             // among this rank's receives from src
    int consumed;            // its send has been copied by the receiver
    int live;                // started and not yet waited for
} HubExchange;

// The in-memory ring, point to point like the real links: start() records a rank's exchange
// (after finishing the rank's queued work, so its send is written and nothing still reads the
// buffer its receive replaces) and returns its handle; wait(handle) copies into its receive the
// matching send (the k-th receive from src takes src's k-th send to this rank) once src has
// started it, then waits until the receiver of its own send has copied it. A wait meets only
// its two peers, never the whole ring, so one exchange finishes while others stay in flight.
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int P;
    HubExchange x[HUB_MAXP][HUB_MAXQ];  // rank's exchange with handle h in slot h % HUB_MAXQ
    int started[HUB_MAXP];              // exchanges each rank has started
    int sends[HUB_MAXP][HUB_MAXP];      // [a][b]: sends from rank a to rank b started
    int recvs[HUB_MAXP][HUB_MAXP];      // [a][b]: receives by rank a from rank b started
    int sent[HUB_MAXP];                 // blocks each rank has sent, over the whole run
} Hub;

typedef struct {
    Hub *hub;
    Backend *be;
    int rank;
} Port;

static inline int hub_start(void *ctx, const void *send, size_t send_bytes, int dst, void *recv,
                            size_t recv_bytes, int src) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    const int me = pt->rank;
    CHECK(send || recv);
    pt->be->synchronize(pt->be);
    pthread_mutex_lock(&h->mu);
    const int handle = h->started[me]++;
    HubExchange *e = &h->x[me][handle % HUB_MAXQ];
    CHECK(!e->live);  // more exchanges in flight than the link allows
    *e = (HubExchange){.send = send, .recv = recv, .dst = dst, .src = src,
                       .send_bytes = send_bytes, .recv_bytes = recv_bytes,
                       .send_seq = send ? h->sends[me][dst]++ : -1,
                       .recv_seq = recv ? h->recvs[me][src]++ : -1, .live = 1};
    h->sent[me] += send != NULL;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return handle;
}

// The live send of rank src to rank me with place seq, or NULL (called under the lock).
static inline HubExchange *hub_find_send(Hub *h, int src, int me, int seq) {
    for (int i = 0; i < HUB_MAXQ; i++) {
        HubExchange *e = &h->x[src][i];
        if (e->live && e->send && e->dst == me && e->send_seq == seq) return e;
    }
    return NULL;
}

static inline void hub_wait(void *ctx, int handle) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    const int me = pt->rank;
    pthread_mutex_lock(&h->mu);
    HubExchange *e = &h->x[me][handle % HUB_MAXQ];
    CHECK(e->live && h->started[me] - handle <= HUB_MAXQ);
    if (e->recv) {
        HubExchange *from;
        while (!(from = hub_find_send(h, e->src, me, e->recv_seq)))
            pthread_cond_wait(&h->cv, &h->mu);
        CHECK(from->send_bytes == e->recv_bytes);
        pthread_mutex_unlock(&h->mu);
        pt->be->copy(pt->be, e->recv, from->send, e->recv_bytes);
        pt->be->synchronize(pt->be);
        pthread_mutex_lock(&h->mu);
        from->consumed = 1;
        pthread_cond_broadcast(&h->cv);
    }
    while (e->send && !e->consumed) pthread_cond_wait(&h->cv, &h->mu);
    e->live = 0;
    pthread_mutex_unlock(&h->mu);
}

static inline void hub_init(Hub *h, int P) {
    memset(h, 0, sizeof *h);
    h->P = P;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
}

static inline void hub_destroy(Hub *h) {
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
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
