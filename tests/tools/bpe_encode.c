// bpe_encode: drives data/gpt2_bpe for tests/test_gpt2_bpe.py and scripts/bench_tokenizer.py.
//   bpe_encode --encoder encoder.json --vocab vocab.bpe [options] INPUT
//     (default)         prints the ids of INPUT, space-separated, on one line
//     --out FILE        writes the ids as int32 little-endian instead
//     --decoded FILE    also writes the bytes of the ids (decode) to FILE
//     --cases           INPUT is a list of records (uint32 little-endian length, bytes); each
//                       record is encoded on its own and printed as one line of ids (with
//                       --out: written as records of uint32 count and int32 ids)
//     --threads N       uses gpt2_bpe_encode_parallel with N threads (0: all)
//     --bench R         encodes R times and prints "seconds: <best> mb_per_s: <rate>"
// Exit code 2 with a message for bad arguments or tokenizer files.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "data/gpt2_bpe.h"

typedef struct {
    const char *encoder, *vocab, *input, *out, *decoded;
    int cases, threads, bench;   // threads < 0: single-threaded gpt2_bpe_encode
} Args;

static void usage_exit(const char *msg) {
    fprintf(stderr, "error: %s\nusage: bpe_encode --encoder FILE --vocab FILE [--out FILE] "
            "[--decoded FILE] [--cases] [--threads N] [--bench R] INPUT\n", msg);
    exit(EXIT_USAGE);
}

static Args parse_args(int argc, char **argv) {
    Args a = {.threads = -1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(k, "--cases")) a.cases = 1;
        else if (!strcmp(k, "--encoder") && has_val) a.encoder = argv[++i];
        else if (!strcmp(k, "--vocab") && has_val) a.vocab = argv[++i];
        else if (!strcmp(k, "--out") && has_val) a.out = argv[++i];
        else if (!strcmp(k, "--decoded") && has_val) a.decoded = argv[++i];
        else if (!strcmp(k, "--threads") && has_val) a.threads = atoi(argv[++i]);
        else if (!strcmp(k, "--bench") && has_val) a.bench = atoi(argv[++i]);
        else if (k[0] == '-' && k[1]) usage_exit("unknown option or missing value");
        else a.input = k;
    }
    if (!a.encoder || !a.vocab || !a.input) usage_exit("--encoder, --vocab and INPUT are required");
    return a;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void encode(const Gpt2Bpe *t, const Args *a, const char *s, size_t len, int **ids,
                   size_t *n, size_t *cap) {
    *n = 0;
    char err[ERR_LEN];
    const int rc = a->threads < 0 ? gpt2_bpe_encode(t, s, len, ids, n, cap, err, sizeof err)
                                  : gpt2_bpe_encode_parallel(t, s, len, a->threads, ids, n, cap, err, sizeof err);
    if (rc != 0) fatal(EXIT_RUNTIME, "bpe_encode: %s", err);
}

static void print_ids(const int *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
}

static void write_decoded(const Gpt2Bpe *t, const char *path, const int *ids, size_t n) {
    FILE *f = fopen_or_die(path, "wb");
    for (size_t i = 0; i < n; i++) {
        int len;
        const unsigned char *p = gpt2_bpe_token_bytes(t, ids[i], &len);
        CHECK(p != NULL);
        fwrite(p, 1, (size_t)len, f);
    }
    fclose(f);
}

static void run_cases(const Gpt2Bpe *t, const Args *a, const char *buf, size_t len) {
    int *ids = NULL;
    size_t n = 0, cap = 0;
    FILE *out = a->out ? fopen_or_die(a->out, "wb") : NULL;
    for (size_t pos = 0; pos < len;) {
        uint32_t k;
        if (len - pos < 4) fatal(EXIT_USAGE, "%s: truncated record header at byte %zu", a->input, pos);
        memcpy(&k, buf + pos, 4);
        pos += 4;
        if (len - pos < k) fatal(EXIT_USAGE, "%s: record at byte %zu overruns the file", a->input, pos);
        encode(t, a, buf + pos, k, &ids, &n, &cap);
        if (out) {
            uint32_t count = (uint32_t)n;
            if (fwrite(&count, 4, 1, out) != 1 || fwrite(ids, sizeof(int), n, out) != n)
                fatal(EXIT_RUNTIME, "%s: short write", a->out);
        } else {
            print_ids(ids, n);
        }
        pos += k;
    }
    if (out) fclose(out);
    free(ids);
}

int main(int argc, char **argv) {
    Args a = parse_args(argc, argv);
    char err[512];
    double t0 = now_s();
    Gpt2Bpe *t = gpt2_bpe_load(a.encoder, a.vocab, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "%s", err);
    double load_s = now_s() - t0;
    size_t len;
    char *buf = read_file_or_die(a.input, &len);
    if (a.cases) {
        run_cases(t, &a, buf, len);
    } else {
        int *ids = NULL;
        size_t n = 0, cap = 0;
        double best = 1e30;
        for (int r = 0; r < (a.bench > 0 ? a.bench : 1); r++) {
            double s = now_s();
            encode(t, &a, buf, len, &ids, &n, &cap);
            double d = now_s() - s;
            if (d < best) best = d;
        }
        if (a.bench > 0)
            printf("tokens: %zu load_seconds: %.4f seconds: %.5f mb_per_s: %.2f\n", n, load_s, best,
                   (double)len / best / 1e6);
        if (a.out) {
            FILE *f = fopen_or_die(a.out, "wb");
            if (fwrite(ids, sizeof(int), n, f) != n) fatal(EXIT_RUNTIME, "%s: short write", a.out);
            fclose(f);
        } else if (a.bench <= 0) {
            print_ids(ids, n);
        }
        if (a.decoded) write_decoded(t, a.decoded, ids, n);
        free(ids);
    }
    free(buf);
    gpt2_bpe_free(t);
    return 0;
}
