// cli/eval_passkey: `train_gpt eval --passkey`: the passkey retrieval grid of a checkpoint
// (trainer/passkey.h), its texts encoded by the checkpoint's tokenizer (GPT-2 BPE for a GPT-2
// vocabulary, else one token per character or byte), on the backend of --device.
#include "cli/cli.h"
#include "cli/eval.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/gpt2_bpe.h"
#include "trainer/passkey.h"

typedef struct {
    const Tokenizer *tok;
    Gpt2Bpe *bpe;   // for a GPT-2 vocabulary, else NULL
} Encoder;

// The ids of text into r (malloc'ed); exits 2 when the tokenizer cannot encode it.
static void encode(const Encoder *e, const char *text, TokenRun *r) {
    const size_t len = strlen(text);
    char err[ERR_LEN];
    if (e->bpe) {
        int *ids = NULL;
        size_t n = 0, cap = 0;
        if (gpt2_bpe_encode(e->bpe, text, len, &ids, &n, &cap, err, sizeof err) != 0)
            fatal(EXIT_USAGE, "eval --passkey: %s", err);
        r->ids = ids;
        r->n = (int)n;
        return;
    }
    int *ids = xmalloc((len + 1) * sizeof(int));
    const long n = tokenizer_encode_simple(e->tok, text, ids, (long)len);
    if (n <= 0)
        fatal(EXIT_USAGE, "eval --passkey: the checkpoint's tokenizer cannot encode \"%s\": a char vocabulary "
              "needs every character of the passkey texts (letters, digits, space, '.', '?', newline)", text);
    r->ids = ids;
    r->n = (int)n;
}

static void run_free(TokenRun *r) {
    free((void *)r->ids);
}

// The trials' pieces: intro, filler and question shared, needle and answer of each key.
typedef struct {
    PasskeyPieces *trial;
    int n, min_length;   // the longest minimal length over the trials
} Trials;

static Trials make_trials(const Encoder *e, const PasskeyArgs *a) {
    Trials t = {xcalloc((size_t)a->trials, sizeof(PasskeyPieces)), a->trials, 0};
    PasskeyPieces shared;
    encode(e, PASSKEY_INTRO, &shared.intro);
    encode(e, PASSKEY_FILLER, &shared.filler);
    encode(e, PASSKEY_QUESTION, &shared.question);
    Rng rng;
    rng_seed(&rng, (uint64_t)a->seed);
    for (int i = 0; i < t.n; i++) {
        char needle[160], answer[32];
        passkey_key_texts(passkey_draw_key(&rng), needle, sizeof needle, answer, sizeof answer);
        t.trial[i] = shared;
        encode(e, needle, &t.trial[i].needle);
        encode(e, answer, &t.trial[i].answer);
        const int need = passkey_min_length(&t.trial[i]);
        if (need > t.min_length) t.min_length = need;
    }
    return t;
}

static void trials_free(Trials *t) {
    if (t->n > 0) {
        run_free(&t->trial[0].intro);
        run_free(&t->trial[0].filler);
        run_free(&t->trial[0].question);
    }
    for (int i = 0; i < t->n; i++) {
        run_free(&t->trial[i].needle);
        run_free(&t->trial[i].answer);
    }
    free(t->trial);
}

// The lengths asked for, checked against the model and the prompt, or the default ones.
static int grid_lengths(const PasskeyArgs *a, const Config *c, int min_length, int *out) {
    if (a->n_lengths == 0) {
        const int T = c->train.seq_len, cand[3] = {T / 4, T / 2, T};
        int n = 0;
        for (int k = 0; k < 3; k++)
            if (cand[k] >= min_length && (n == 0 || cand[k] > out[n - 1])) out[n++] = cand[k];
        if (n == 0)
            fatal(EXIT_USAGE, "eval --passkey: train.seq_len %d cannot hold the passkey prompt, which needs at "
                  "least %d tokens with this tokenizer", T, min_length);
        return n;
    }
    for (int k = 0; k < a->n_lengths; k++) {
        if (a->lengths[k] > c->model.max_seq_len)
            fatal(EXIT_USAGE, "--passkey-lengths: %d is longer than the model's max_seq_len %d", a->lengths[k],
                  c->model.max_seq_len);
        if (a->lengths[k] < min_length)
            fatal(EXIT_USAGE, "--passkey-lengths: %d tokens cannot hold the passkey prompt, which needs at least "
                  "%d with this tokenizer", a->lengths[k], min_length);
        out[k] = a->lengths[k];
    }
    return a->n_lengths;
}

static void print_header(const PasskeyArgs *a) {
    printf("passkey: fraction of %d trials recalled by greedy decoding (rows: length in tokens, columns: depth)\n",
           a->trials);
    printf("%8s", "length");
    for (int d = 0; d < a->n_depths; d++) printf(" %6.2f", a->depths[d]);
    printf("\n");
}

static cJSON *number_array(const double *x, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(x[i]));
    return arr;
}

void eval_passkey(const char *ckpt, const char *device, const PasskeyArgs *a, const char *json) {
    Config c;
    Backend *be = cli_open_checkpoint(ckpt, &c, device);
    Tokenizer *tok = cli_checkpoint_tokenizer(ckpt, &c);
    if (!tok) fatal(EXIT_USAGE, "eval --passkey needs a tokenizer, and checkpoint '%s' has none", ckpt);
    Encoder e = {tok, NULL};
    if (tokenizer_vocab_size(tok) == 50257 && tokenizer_eot(tok) == GPT2_EOT) {
        char err[ERR_LEN];
        e.bpe = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
        if (!e.bpe) fatal(EXIT_USAGE, "eval --passkey: the prompts need GPT-2's BPE files: %s", err);
    }
    Trials t = make_trials(&e, a);
    int lengths[PASSKEY_MAX_LIST];
    const int n_len = grid_lengths(a, &c, t.min_length, lengths);
    GPT *m = cli_load_checkpoint_model(ckpt, &c, be, 1, 1);

    double acc[PASSKEY_MAX_LIST][PASSKEY_MAX_LIST], sum = 0;
    int longest = 0;   // the lengths come in the order asked for
    for (int l = 0; l < n_len; l++) longest = lengths[l] > longest ? lengths[l] : longest;
    // One sequence's cache of the longest length asked for (its prompt and answer), not of
    // max_seq_len: a long-context model's whole cache may not fit, and short lengths need less.
    char err[ERR_LEN];
    if (gpt_decode_reserve(m, 1, longest, err, sizeof err) != 0) fatal(EXIT_USAGE, "eval --passkey: %s", err);
    int *seq = xmalloc((size_t)longest * sizeof(int));
    print_header(a);
    for (int l = 0; l < n_len; l++) {
        printf("%8d", lengths[l]);
        for (int d = 0; d < a->n_depths; d++) {
            int hits = 0;
            for (int i = 0; i < t.n; i++) {
                PasskeyLayout lay;
                if (passkey_layout(&t.trial[i], lengths[l], a->depths[d], &lay, err, sizeof err) != 0)
                    fatal(EXIT_USAGE, "--passkey-lengths: %s", err);   // grid_lengths checked it
                passkey_build(&t.trial[i], &lay, seq);
                hits += passkey_recalled(m, seq, &lay, t.trial[i].answer.n);
            }
            acc[l][d] = (double)hits / t.n;
            sum += acc[l][d];
            printf(" %6.2f", acc[l][d]);
            fflush(stdout);
        }
        printf("\n");
    }
    const double mean = sum / (n_len * a->n_depths);
    printf("passkey_accuracy: %.4f\n", mean);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "event", "eval_passkey");
        cJSON_AddNumberToObject(o, "seq_len", c.train.seq_len);
        cJSON_AddNumberToObject(o, "trials", a->trials);
        cJSON_AddNumberToObject(o, "seed", (double)a->seed);
        cJSON_AddNumberToObject(o, "digits", PASSKEY_DIGITS);
        double len_d[PASSKEY_MAX_LIST];
        for (int l = 0; l < n_len; l++) len_d[l] = lengths[l];
        cJSON_AddItemToObject(o, "lengths", number_array(len_d, n_len));
        cJSON_AddItemToObject(o, "depths", number_array(a->depths, a->n_depths));
        cJSON *rows = cJSON_AddArrayToObject(o, "accuracy");
        for (int l = 0; l < n_len; l++) cJSON_AddItemToArray(rows, number_array(acc[l], a->n_depths));
        cJSON_AddNumberToObject(o, "mean_accuracy", mean);
        eval_write_json(o, json);
    }
    free(seq);
    trials_free(&t);
    if (e.bpe) gpt2_bpe_free(e.bpe);
    tokenizer_free(tok);
    gpt_free(m);
    be->destroy(be);
}
