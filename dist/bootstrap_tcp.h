// bootstrap_tcp: rank 0 hands a few bytes (NCCL's unique id) to every other rank over TCP, for
// launches without MPI (torchrun, srun). Rank 0 listens on `port` (the launchers' MASTER_PORT + 1:
// torchrun's own store holds MASTER_PORT); the others connect to addr:port, retrying until rank 0
// is up, and send their rank; rank 0 answers each with the bytes. Everything is bounded by
// timeout_s, and the error says which ranks did not arrive (rank 0) or that rank 0 could not be
// reached (the others).
#pragma once
#include <stddef.h>

// Rank 0's buf (len bytes) into every rank's buf. Returns 0, or -1 with err set.
int tcp_broadcast(const char *addr, int port, int rank, int world, void *buf, size_t len,
                  double timeout_s, char *err, size_t errlen);
