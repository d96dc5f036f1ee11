// Config table: defaults, JSON parsing, --set overrides, validation and the error messages that
// name the key, file and line.
#include <string.h>

#include "common/config.h"
#include "tests/testlib.h"

static int load(Config *c, const char *json, char *err) {
    config_defaults(c);
    return config_load_json(c, json, "test.json", err, 512);
}

// dist.context_parallel's own rules, and the configs that use it.
static void test_context_parallel(void) {
    char err[512];
    Config c;
    config_defaults(&c);
    EXPECT(c.dist.context_parallel == 1, "default %d", c.dist.context_parallel);
    config_set(&c, "data.synthetic=copy", err, sizeof err);
    EXPECT(config_set(&c, "dist.context_parallel=0", err, sizeof err) != 0 &&
               strstr(err, "dist.context_parallel"), "0: %s", err);
    config_set(&c, "dist.context_parallel=4", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) == 0, "1024 = 8 chunks of 128: %s", err);
    config_set(&c, "train.seq_len=1020", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "train.seq_len (1020)") &&
               strstr(err, "multiple of 8"), "seq_len: %s", err);
    config_set(&c, "train.seq_len=1024", err, sizeof err);
    const char *bad[][2] = {{"attention.impl=naive", "attention.impl = flash"},
                            {"attention.dropout=0.1", "attention.dropout"},
                            {"attention.doc_mask=true", "attention.doc_mask"}};
    config_set(&c, "data.eot_token=0", err, sizeof err);
    for (int i = 0; i < 3; i++) {
        Config d = c;
        config_set(&d, bad[i][0], err, sizeof err);
        EXPECT(config_validate(&d, err, sizeof err) != 0 && strstr(err, bad[i][1]) &&
                   strstr(err, "dist.context_parallel"), "%s: %s", bad[i][0], err);
    }
    // The long-context configs that need GPUs to run still validate here.
    const char *files[] = {"configs/long_256k_cp2.json", "configs/long_1m_cp8.json"};
    const int cps[] = {2, 8}, seqs[] = {262144, 1048576};
    for (int i = 0; i < 2; i++) {
        config_defaults(&c);
        EXPECT(config_load_file(&c, files[i], err, sizeof err) == 0 &&
                   config_validate(&c, err, sizeof err) == 0, "%s: %s", files[i], err);
        EXPECT(c.dist.context_parallel == cps[i] && c.train.seq_len == seqs[i] &&
                   c.model.max_seq_len == seqs[i] && c.model.pos_embedding == POS_ROPE &&
                   c.model.n_layer == 12 && c.model.n_embd == 768,
               "%s: not the GPT-2 124M RoPE shape at the intended length", files[i]);
    }
}

// attention.dropout and model.dropout run to the nearest 1/256: a rate that rounds to 0 is refused,
// naming the key.
static void test_attention_dropout_resolution(void) {
    char err[512];
    Config c;
    config_defaults(&c);
    config_set(&c, "data.synthetic=copy", err, sizeof err);
    config_set(&c, "attention.dropout=0.001", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "attention.dropout = 0.001") &&
               strstr(err, "1/256"), "0.001: %s", err);
    config_set(&c, "attention.dropout=0.002", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) == 0, "0.002 (1/256): %s", err);
    config_set(&c, "model.dropout=0.0015", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "model.dropout = 0.0015"), "model 0.0015: %s",
           err);
}

// attention.sparse's rules (each message names the key) and the million-token sparse config.
static void test_sparse(void) {
    char err[512];
    Config c;
    config_defaults(&c);
    config_set(&c, "data.synthetic=copy", err, sizeof err);
    EXPECT(c.attention.sparse == 0 && c.attention.sparse_every == 1, "default dense");
    EXPECT(config_set(&c, "attention.sparse=diagonal", err, sizeof err) != 0 && strstr(err, "attention.sparse"),
           "unknown pattern: %s", err);
    config_set(&c, "attention.sparse=local_global", err, sizeof err);
    EXPECT(config_validate(&c, err, sizeof err) == 0, "1024-token band at seq_len 1024: %s", err);
    const char *bad[][2] = {
        {"attention.sparse_band=2048", "attention.sparse_band (2048 tokens) does not fit train.seq_len (1024)"},
        {"attention.sparse_band=200", "attention.sparse_band (200) must be a multiple of the 128-token block"},
        {"attention.sparse_global=1152", "attention.sparse_global (1152 tokens) does not fit train.seq_len"},
        {"attention.sparse_global=100", "attention.sparse_global (100) must be a multiple"},
        {"attention.impl=naive", "needs attention.impl = flash"},
        {"dist.context_parallel=2", "dist.context_parallel"},
    };
    for (int i = 0; i < 6; i++) {
        Config d = c;
        config_set(&d, bad[i][0], err, sizeof err);
        EXPECT(config_validate(&d, err, sizeof err) != 0 && strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    Config d = c;
    config_set(&d, "attention.sparse=strided", err, sizeof err);
    config_set(&d, "attention.sparse_stride=4096", err, sizeof err);
    EXPECT(config_validate(&d, err, sizeof err) != 0 && strstr(err, "attention.sparse_stride (4096 tokens)"),
           "stride: %s", err);
    d = c;
    config_set(&d, "attention.sparse=bigbird", err, sizeof err);
    config_set(&d, "attention.sparse_random=9", err, sizeof err);
    EXPECT(config_validate(&d, err, sizeof err) != 0 && strstr(err, "attention.sparse_random (9 blocks)"),
           "random: %s", err);
    d = c;
    config_set(&d, "attention.sparse=none", err, sizeof err);
    config_set(&d, "attention.sparse_every=2", err, sizeof err);
    EXPECT(config_validate(&d, err, sizeof err) != 0 && strstr(err, "attention.sparse_every"), "every: %s", err);
    config_defaults(&c);
    EXPECT(config_load_file(&c, "configs/long_1m_sparse.json", err, sizeof err) == 0 &&
               config_validate(&c, err, sizeof err) == 0, "long_1m_sparse.json: %s", err);
    EXPECT(c.train.seq_len == 1048576 && c.model.pos_embedding == POS_ROPE && c.model.n_layer == 12 &&
               c.model.n_embd == 768 && c.attention.sparse != 0 && c.train.recompute == RECOMPUTE_BLOCK,
           "long_1m_sparse.json: not GPT-2 124M with RoPE, sparse and recompute block at 1M");
}

int main(void) {
    char err[512];
    Config c;

    TEST_CASE("defaults are GPT-2 small and valid", {
        config_defaults(&c);
        EXPECT(c.model.n_layer == 12 && c.model.n_embd == 768 && c.model.vocab_size == 50257, "defaults");
        EXPECT(strcmp(c.precision.loss_scale, "dynamic") == 0, "loss scale %s", c.precision.loss_scale);
        EXPECT(c.attention.window == -1 && c.train.seed == 1337, "window/seed");
        EXPECT(config_set(&c, "data.synthetic=copy", err, sizeof err) == 0, "%s", err);
        EXPECT(config_validate(&c, err, sizeof err) == 0, "%s", err);
        EXPECT(c.model.n_kv_head == 12, "n_kv_head resolved to n_head, got %d", c.model.n_kv_head);
    });

    TEST_CASE("json sections and types", {
        const char *j = "{\"model\": {\"n_layer\": 4, \"pos_embedding\": \"alibi\", \"rope_theta\": 5e5},\n"
                        " \"precision\": {\"loss_scale\": 1024},\n \"data\": {\"shuffle\": true}}";
        EXPECT(load(&c, j, err) == 0, "%s", err);
        EXPECT(c.model.n_layer == 4 && c.model.pos_embedding == POS_ALIBI, "model");
        EXPECT(c.model.rope_theta == 5e5f && c.data.shuffle == 1, "float/bool");
        EXPECT(strcmp(c.precision.loss_scale, "1024") == 0, "numeric loss scale '%s'", c.precision.loss_scale);
    });

    TEST_CASE("errors name the key, file and line", {
        EXPECT(load(&c, "{\"model\": {\n \"n_layr\": 4}}", err) != 0 && strstr(err, "model.n_layr") &&
                   strstr(err, "test.json:2"), "unknown key: %s", err);
        EXPECT(load(&c, "{\"modle\": {}}", err) != 0 && strstr(err, "modle") &&
                   strstr(err, "(expected model, data, train, optim, precision, attention, dist, log)"),
               "unknown section: %s", err);
        EXPECT(load(&c, "{\"model\": {\"n_layer\": \"4\"}}", err) != 0 && strstr(err, "model.n_layer") &&
                   strstr(err, "integer"), "wrong type: %s", err);
        EXPECT(load(&c, "{\"model\": {\"n_layer\": 2.5}}", err) != 0 && strstr(err, "integer"), "fraction: %s", err);
        EXPECT(load(&c, "{\"model\": {\"n_layer\": 0}}", err) != 0 && strstr(err, "out of range"), "range: %s", err);
        EXPECT(load(&c, "{\"optim\": {\"schedule\": \"cosin\"}}", err) != 0 && strstr(err, "cosine|linear|constant"),
               "enum: %s", err);
        EXPECT(load(&c, "{\"model\": {\n\"n_layer\": 4,,}}", err) != 0 && strstr(err, "malformed JSON") &&
                   strstr(err, "test.json:2"), "malformed: %s", err);
        EXPECT(load(&c, "[1, 2]", err) != 0 && strstr(err, "object"), "not an object: %s", err);
        EXPECT(load(&c, "{\"precision\": {\"loss_scale\": \"dynamc\"}}", err) != 0 && strstr(err, "dynamic"),
               "loss scale: %s", err);
        EXPECT(load(&c, "{\"precision\": {\"loss_scale\": -4}}", err) != 0, "negative scale accepted");
    });

    TEST_CASE("--set overrides", {
        config_defaults(&c);
        EXPECT(config_set(&c, "train.steps=77", err, sizeof err) == 0 && c.train.steps == 77, "%s", err);
        EXPECT(config_set(&c, "optim.lr=0.01", err, sizeof err) == 0 && c.optim.lr == 0.01f, "%s", err);
        EXPECT(config_set(&c, "log.dir=runs/x", err, sizeof err) == 0 && strcmp(c.log.dir, "runs/x") == 0, "%s", err);
        EXPECT(config_set(&c, "train.steps", err, sizeof err) != 0 && strstr(err, "key=value"), "no '=': %s", err);
        EXPECT(config_set(&c, "train.stepz=1", err, sizeof err) != 0 && strstr(err, "train.stepz"), "unknown: %s", err);
        EXPECT(config_set(&c, "train.steps=ten", err, sizeof err) != 0 && strstr(err, "integer"), "type: %s", err);
        EXPECT(config_set(&c, "attention.deterministic=yes", err, sizeof err) != 0, "bool accepted 'yes'");
    });

    TEST_CASE("cross-key rules", {
        config_defaults(&c);
        config_set(&c, "data.synthetic=copy", err, sizeof err);
        config_set(&c, "model.n_head=5", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "divisible"), "C %% NH: %s", err);
        config_set(&c, "model.n_head=12", err, sizeof err);
        config_set(&c, "model.n_kv_head=5", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "n_kv_head"), "NH %% NKV: %s", err);
        config_set(&c, "model.n_kv_head=4", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) == 0, "%s", err);
        config_set(&c, "train.seq_len=2048", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "max_seq_len"), "seq_len: %s", err);
        config_set(&c, "train.seq_len=1024", err, sizeof err);
        config_set(&c, "optim.min_lr=0.1", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "min_lr"), "min_lr: %s", err);
        config_set(&c, "optim.min_lr=0", err, sizeof err);
        config_set(&c, "data.synthetic=none", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "data.train"), "no data: %s", err);
    });

    TEST_CASE("model.rope_dims", {
        config_defaults(&c);
        EXPECT(c.model.rope_dims == 0, "default rope_dims %d", c.model.rope_dims);
        EXPECT(load(&c, "{\"model\": {\"pos_embedding\": \"rope\", \"rope_dims\": 32}, "
                        "\"data\": {\"synthetic\": \"copy\"}}", err) == 0, "%s", err);
        EXPECT(c.model.rope_dims == 32 && config_validate(&c, err, sizeof err) == 0, "json: %s", err);
        EXPECT(config_set(&c, "model.rope_dims=64", err, sizeof err) == 0 && c.model.rope_dims == 64, "%s", err);
        EXPECT(config_validate(&c, err, sizeof err) == 0, "rope_dims = head size 64: %s", err);
        EXPECT(config_set(&c, "model.rope_dims=-2", err, sizeof err) != 0 && strstr(err, "model.rope_dims") &&
                   strstr(err, "out of range"), "negative: %s", err);
        config_set(&c, "model.rope_dims=6", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) == 0, "%s", err);
        config_set(&c, "model.rope_dims=7", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "model.rope_dims (7)") &&
                   strstr(err, "even"), "odd: %s", err);
        config_set(&c, "model.rope_dims=66", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "model.rope_dims (66)") &&
                   strstr(err, "head size") && strstr(err, "(64)"), "too large: %s", err);
        config_set(&c, "model.rope_dims=16", err, sizeof err);
        config_set(&c, "model.pos_embedding=alibi", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) != 0 && strstr(err, "model.rope_dims = 16") &&
                   strstr(err, "alibi"), "without rope: %s", err);
        config_set(&c, "model.rope_dims=0", err, sizeof err);
        EXPECT(config_validate(&c, err, sizeof err) == 0, "rope_dims 0 with alibi: %s", err);
    });

    TEST_CASE("dist.context_parallel", test_context_parallel());
    TEST_CASE("attention.sparse", test_sparse());
    TEST_CASE("dropout rates to the nearest 1/256", test_attention_dropout_resolution());

    TEST_CASE("to_json round trip", {
        config_defaults(&c);
        config_set(&c, "model.n_layer=3", err, sizeof err);
        config_set(&c, "precision.loss_scale=512", err, sizeof err);
        config_set(&c, "train.seed=123456789", err, sizeof err);
        char *j = config_to_json(&c);
        Config d;
        EXPECT(load(&d, j, err) == 0, "%s", err);
        EXPECT(memcmp(&c, &d, sizeof c) == 0, "round trip differs");
        EXPECT(config_same_model(&c, &d, err, sizeof err) == 0, "%s", err);
        config_set(&d, "model.n_layer=4", err, sizeof err);
        EXPECT(config_same_model(&c, &d, err, sizeof err) != 0 && strstr(err, "model.n_layer"), "%s", err);
        config_set(&d, "model.n_layer=3", err, sizeof err);
        config_set(&d, "model.rope_dims=8", err, sizeof err);
        EXPECT(config_same_model(&c, &d, err, sizeof err) != 0 && strstr(err, "model.rope_dims"), "%s", err);
        // A config saved before model.rope_dims existed loads as 0 (all dimensions rotated).
        EXPECT(load(&d, "{\"model\": {\"pos_embedding\": \"rope\"}}", err) == 0 && d.model.rope_dims == 0,
               "%s", err);
        free(j);
    });
    return TEST_SUMMARY();
}
