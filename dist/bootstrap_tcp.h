// bootstrap_tcp: rank 0 hands a few bytes (NCCL's unique id) to every other rank over TCP, for
// launches without MPI (torchrun, srun). Rank 0 listens on `port` (the launchers' MASTER_PORT + 1:
// torchrun's own store holds MASTER_PORT), on MASTER_ADDR's interface when that names this host,
// else on every interface; the others connect to addr:port, retrying until rank 0 is up.
//
// The exchange, per connection: rank 0 sends a magic word and a fresh random nonce; the rank
// answers with the magic word, its rank and HMAC-SHA256(token, nonce || rank); rank 0 answers a
// correct proof for a rank not yet served with the magic word and the bytes. Anything else (no
// hello within TCP_HELLO_TIMEOUT_S, a wrong magic word or proof, a rank outside the world, a rank
// already served) is closed without an answer and reported in one line on `log`: a stray or
// hostile connection neither stalls the others (rank 0 serves many connections at once, each
// with its own deadline) nor takes a rank's place. Everything is bounded by timeout_s, and the
// error says which ranks did not arrive (rank 0) or that rank 0 could not be reached or refused
// this rank (the others).
#pragma once
#include <stddef.h>
#include <stdio.h>

// How long rank 0 waits for one connection's hello (a real rank answers in microseconds).
#define TCP_HELLO_TIMEOUT_S 2.0

typedef struct {
    const char *addr;   // MASTER_ADDR: rank 0's host
    int port;           // MASTER_PORT + 1
    int rank, world;
    const char *token;  // the job's secret (LaunchInfo's job_token), alike on all ranks; "": none
    double timeout_s;   // the whole exchange
    FILE *log;          // rank 0 reports each refused connection here; NULL: nowhere
} TcpBootstrap;

// Rank 0's buf (len bytes) into every rank's buf. Returns 0, or -1 with err set.
int tcp_broadcast(const TcpBootstrap *b, void *buf, size_t len, char *err, size_t errlen);

// 1 when addr names this host's loopback alone wherever it is resolved ("localhost", 127.0.0.0/8,
// ::1), so that no other host can reach a port bound to it; 0 otherwise (a host name that only
// this host's /etc/hosts maps to 127.0.1.1 included).
int tcp_addr_is_loopback(const char *addr);
