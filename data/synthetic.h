// synthetic: built-in tasks that need no files (data.synthetic), for demos, tests and long-context
// acceptance runs. A task is fixed by (name, vocab, T, seed); each sequence is generated from its
// own 64-bit stream seed, so any sequence can be regenerated without the ones before it.
//   copy:   ids uniform in [0, min(V, 256)); the sequence repeats with period H = T/2, so the
//           second half copies the first; targets of positions t < H are -1 (unpredictable), the
//           rest can only be predicted by attending H-1 positions back. Loss floor 0.
//   retrieval: associative recall over the whole sequence. With S = min(V, 256) and K =
//           min(16, S/4) pairs: the sequence opens with K (key, value) pairs (keys distinct in
//           [0, S/4), values in [S/4, S/2)), then filler in [S/2, S), and closes with the same K
//           pairs in a shuffled order. Only each closing key's target (its value) counts, the
//           rest is -1: each answer needs a key defined about T - 4K positions back, so the
//           distance is set by train.seq_len, and a sliding window shorter than that leaves
//           chance loss ln(S/4). Loss floor 0.
//   retrieval_spread: retrieval with the opening pairs at a uniform random offset in [0, T - 4K]
//           (filler before and after them), so within one batch the answers lie anywhere from 1
//           to T - 1 positions back, not only about T (for curricula that need the lookup at
//           every distance; docs/PERFORMANCE.md has what it did in one). Loss floor 0.
//   markov: a seeded first-order Markov chain over the ids [0, S), S = min(V, 256); each state
//           has K = min(S, 4) successors with Dirichlet(1) probabilities (one of them the next
//           state mod S, so the chain is irreducible). The first token is drawn from the
//           stationary distribution pi, so every target has expected loss equal to the entropy
//           rate sum_i pi_i H(P_i), computed exactly (to 1e-12) and returned as the floor.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Synthetic Synthetic;   // opaque

// Returns NULL with err naming data.synthetic and the problem (unknown name, T too small).
Synthetic *synthetic_create(const char *name, int vocab_size, int T, uint64_t seed, char *err,
                            size_t errlen);
void synthetic_free(Synthetic *s);
// One sequence from stream_seed: inputs (T,), targets (T,) with -1 for ignored targets.
void synthetic_sequence(const Synthetic *s, uint64_t stream_seed, int *inputs, int *targets);
// The lowest achievable mean loss over non-ignored targets, in nats.
double synthetic_loss_floor(const Synthetic *s);
