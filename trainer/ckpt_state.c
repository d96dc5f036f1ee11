// ckpt_state: state.json, written and read as text (ckpt_state.h has the format and the
// self-checksum).
#include "trainer/ckpt_state.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

#define SELF_KEY "state_sha256"
#define JSON_MAX_INT 9007199254740992.0   // 2^53: larger counts are not exact in a JSON number

// ---- the self-checksum ----

// The 64 hex digits of the value of the last "state_sha256" member in text, or NULL when the
// text does not end its object with one in the form the writer uses ("state_sha256": "<hex>").
// The writer adds the member last, so no string of the config can come after it.
static char *self_digest_slot(char *text, size_t len) {
    const size_t kl = strlen("\"" SELF_KEY "\"");
    char *key = NULL;
    for (char *p = text; (p = strstr(p, "\"" SELF_KEY "\"")) != NULL; p += kl) key = p;
    if (!key) return NULL;
    char *p = key + kl, *end = text + len;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (p >= end || *p++ != ':') return NULL;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (end - p < SHA256_HEX_LEN + 2 || *p != '"' || p[SHA256_HEX_LEN + 1] != '"') return NULL;
    return p + 1;
}

// The SHA-256 of text with the slot's digits read as '0'.
static void self_digest(const char *text, size_t len, size_t slot, FileDigest *d) {
    char *copy = xmalloc(len + 1);
    memcpy(copy, text, len);
    memset(copy + slot, '0', SHA256_HEX_LEN);
    sha256_buffer(copy, len, d);
    free(copy);
}

// ---- writing ----

static cJSON *u64_array(const uint64_t *x, int n) {
    // JSON numbers are doubles: 64-bit words travel as hex strings to stay exact.
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        char s[32];
        snprintf(s, sizeof s, "%016" PRIx64, x[i]);
        cJSON_AddItemToArray(a, cJSON_CreateString(s));
    }
    return a;
}

// Numbers printed exactly: cJSON's own printer rounds a double to 15 digits when that reads back
// within a relative DBL_EPSILON, which changes counts above 10^15 and the last bit of a mean.
static void add_int(cJSON *o, const char *key, long long v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    cJSON_AddRawToObject(o, key, text);
}

static void add_real(cJSON *o, const char *key, double v) {
    char text[40];
    snprintf(text, sizeof text, "%.17g", v);
    cJSON_AddRawToObject(o, key, text);
}

char *ckpt_state_format(const TrainState *st, const Config *c, const CkptFile *files, int n_files) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", CKPT_STATE_FORMAT);
    add_int(o, "step", st->step);
    add_int(o, "tokens_seen", st->tokens_seen);
    add_int(o, "world_size", st->world_size);
    cJSON_AddItemToObject(o, "rng", u64_array(st->rng, 4));
    cJSON_AddItemToObject(o, "data", u64_array(st->data, 3));
    cJSON *sc = cJSON_AddObjectToObject(o, "loss_scaler");
    add_real(sc, "scale", st->scaler.scale);
    cJSON_AddBoolToObject(sc, "dynamic", st->scaler.dynamic);
    add_int(sc, "window", st->scaler.window);
    add_int(sc, "clean_steps", st->scaler.clean_steps);
    add_int(sc, "skipped", st->scaler.skipped);
    add_real(o, "guard_loss_mean", isfinite(st->guard_loss_mean) ? st->guard_loss_mean : 0);
    char *cfg = config_to_json(c);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    cJSON *fs = cJSON_AddObjectToObject(o, "files");
    for (int i = 0; i < n_files; i++) {
        cJSON *e = cJSON_AddObjectToObject(fs, files[i].name);
        add_int(e, "size", (long long)files[i].digest.size);
        cJSON_AddStringToObject(e, "sha256", files[i].digest.sha256);
    }
    char zeros[SHA256_HEX_LEN + 1];
    memset(zeros, '0', SHA256_HEX_LEN);
    zeros[SHA256_HEX_LEN] = '\0';
    cJSON_AddStringToObject(o, SELF_KEY, zeros);   // last: see self_digest_slot
    char *printed = cJSON_Print(o);
    cJSON_Delete(o);
    CHECK(printed != NULL);
    char *text = xstrdup(printed);
    cJSON_free(printed);
    const size_t len = strlen(text);
    char *slot = self_digest_slot(text, len);
    CHECK(slot != NULL);
    FileDigest d;
    self_digest(text, len, (size_t)(slot - text), &d);
    memcpy(slot, d.sha256, SHA256_HEX_LEN);
    return text;
}

// ---- reading ----

static int read_u64_array(const cJSON *a, uint64_t *x, int n) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return -1;
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > 16) return -1;
        char *end;
        x[i] = strtoull(s->valuestring, &end, 16);
        if (*end != '\0') return -1;
    }
    return 0;
}

// A count in [lo, hi] (an integer-valued JSON number) into *x; 0 when the item is not one.
static int json_count(const cJSON *o, const char *key, double lo, double hi, long long *x) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *x = (long long)v->valuedouble;
    return 1;
}

static int parse_scaler(const cJSON *sc, LossScaler *s) {
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(sc, "scale");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(sc, "dynamic");
    long long window, clean, skipped;
    if (!cJSON_IsNumber(scale) || !(scale->valuedouble > 0 && scale->valuedouble <= 3.4e38) ||
        !cJSON_IsBool(dyn) || !json_count(sc, "window", 1, 2147483647.0, &window) ||
        !json_count(sc, "clean_steps", 0, 2147483647.0, &clean) ||
        !json_count(sc, "skipped", 0, JSON_MAX_INT, &skipped))
        return -1;
    s->scale = (float)scale->valuedouble;
    s->dynamic = cJSON_IsTrue(dyn);
    s->window = (int)window;
    s->clean_steps = (int)clean;
    s->skipped = skipped;
    return 0;
}

static int parse_files(const cJSON *fs, CkptState *out) {
    if (!cJSON_IsObject(fs)) return -1;
    const int n = cJSON_GetArraySize(fs);
    out->files = xcalloc((size_t)(n ? n : 1), sizeof(CkptFile));
    for (const cJSON *e = fs->child; e; e = e->next) {
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(e, "sha256");
        long long size;
        if (strlen(e->string) >= CKPT_FILE_NAME_MAX || !json_count(e, "size", 0, JSON_MAX_INT, &size) ||
            !cJSON_IsString(sha) || strlen(sha->valuestring) != SHA256_HEX_LEN ||
            strspn(sha->valuestring, "0123456789abcdef") != SHA256_HEX_LEN)
            return -1;
        CkptFile *f = &out->files[out->n_files++];
        snprintf(f->name, sizeof f->name, "%s", e->string);
        memcpy(f->digest.sha256, sha->valuestring, SHA256_HEX_LEN + 1);
        f->digest.size = (uint64_t)size;
    }
    return 0;
}

// The members of a parsed (and verified) state.json into out.
static int parse_members(const cJSON *o, const char *dir, CkptState *out, char *err, size_t errlen) {
    TrainState *st = &out->train;
    long long step, tokens, world;
    const cJSON *mean = cJSON_GetObjectItemCaseSensitive(o, "guard_loss_mean");
    if (!json_count(o, "step", 0, JSON_MAX_INT, &step) ||
        !json_count(o, "tokens_seen", 0, JSON_MAX_INT, &tokens) ||
        !json_count(o, "world_size", 1, 65536, &world) ||
        read_u64_array(cJSON_GetObjectItemCaseSensitive(o, "rng"), st->rng, 4) != 0 ||
        read_u64_array(cJSON_GetObjectItemCaseSensitive(o, "data"), st->data, 3) != 0 ||
        (mean && !(cJSON_IsNumber(mean) && isfinite(mean->valuedouble) && mean->valuedouble >= 0)))
        return set_error(err, errlen, "checkpoint %s: state.json is missing fields or has wrong types "
                                      "(step, tokens_seen, world_size, rng, data): damaged checkpoint", dir);
    st->step = step;
    st->tokens_seen = tokens;
    st->world_size = (int)world;
    st->guard_loss_mean = mean ? mean->valuedouble : 0;
    if (parse_scaler(cJSON_GetObjectItemCaseSensitive(o, "loss_scaler"), &st->scaler) != 0)
        return set_error(err, errlen, "checkpoint %s: state.json: loss_scaler is incomplete or out of "
                                      "range: damaged checkpoint", dir);
    if (out->checked && parse_files(cJSON_GetObjectItemCaseSensitive(o, "files"), out) != 0)
        return set_error(err, errlen, "checkpoint %s: state.json: 'files' must map each file name to "
                                      "its size and sha256 (64 hex digits): damaged checkpoint", dir);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(o, "config");
    if (!cJSON_IsObject(cfg))
        return set_error(err, errlen, "checkpoint %s: state.json has no config object", dir);
    char *text = cJSON_PrintUnformatted(cfg);
    CHECK(text != NULL);
    out->config_json = xstrdup(text);
    cJSON_free(text);
    return 0;
}

// The self-checksum, checked on the raw text before it is parsed, so that a changed byte is
// reported as such even where it breaks the JSON: 0 when the text carries one and it matches
// (slot receives its digits), 1 when the text carries none, -1 on a mismatch.
static int check_self_digest(const char *text, size_t len, char slot_out[SHA256_HEX_LEN + 1]) {
    char *copy = xstrdup(text);   // self_digest_slot takes writable text
    char *slot = self_digest_slot(copy, len);
    int rc = 1;
    if (slot) {
        FileDigest d;
        self_digest(copy, len, (size_t)(slot - copy), &d);
        rc = memcmp(d.sha256, slot, SHA256_HEX_LEN) == 0 ? 0 : -1;
        memcpy(slot_out, slot, SHA256_HEX_LEN);
        slot_out[SHA256_HEX_LEN] = '\0';
    }
    free(copy);
    return rc;
}

// The format tag against the self-checksum the text carried (has_digest, its digits in slot):
// sets out->checked.
static int check_format(const cJSON *o, int has_digest, const char *slot, const char *dir,
                        CkptState *out, char *err, size_t errlen) {
    const cJSON *self = cJSON_GetObjectItemCaseSensitive(o, SELF_KEY);
    // The digits checked on the raw text must be the member's value (not a string of the config
    // that happens to look like one).
    if ((self != NULL) != has_digest ||
        (self && !(cJSON_IsString(self) && strcmp(self->valuestring, slot) == 0)))
        return set_error(err, errlen, "checkpoint %s: state.json is corrupt (its %s member is "
                                      "damaged)", dir, SELF_KEY);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const char *tag = cJSON_IsString(fmt) ? fmt->valuestring : NULL;
    if (tag && strcmp(tag, CKPT_STATE_FORMAT) == 0 && self) {
        out->checked = 1;
        return 0;
    }
    if (tag && strcmp(tag, CKPT_STATE_FORMAT_UNCHECKED) == 0 && !self) {
        out->checked = 0;
        return 0;
    }
    if (tag && strcmp(tag, CKPT_STATE_FORMAT) == 0)
        return set_error(err, errlen, "checkpoint %s: state.json is corrupt (format %s without its "
                                      "%s)", dir, CKPT_STATE_FORMAT, SELF_KEY);
    return set_error(err, errlen, "checkpoint %s: state.json has format '%.40s', expected '%s' (or "
                                  "the older '%s'): not a flashgpt checkpoint, or one of another "
                                  "version", dir, tag ? tag : "(none)", CKPT_STATE_FORMAT,
                     CKPT_STATE_FORMAT_UNCHECKED);
}

int ckpt_state_parse(const char *text, size_t len, const char *dir, CkptState *out, char *err,
                     size_t errlen) {
    memset(out, 0, sizeof *out);
    if (strlen(text) != len)
        return set_error(err, errlen, "checkpoint %s: state.json is corrupt (it contains a NUL byte)", dir);
    char slot[SHA256_HEX_LEN + 1] = "";
    const int digest = check_self_digest(text, len, slot);
    if (digest < 0)
        return set_error(err, errlen, "checkpoint %s: state.json is corrupt (checksum mismatch)", dir);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return set_error(err, errlen, "checkpoint %s: state.json is corrupt (not a JSON object; near "
                                      "byte %zu)", dir, end ? (size_t)(end - text) : (size_t)0);
    }
    int rc = check_format(o, digest == 0, slot, dir, out, err, errlen);
    if (rc == 0) rc = parse_members(o, dir, out, err, errlen);
    cJSON_Delete(o);
    if (rc != 0) ckpt_state_free(out);
    return rc;
}

void ckpt_state_free(CkptState *s) {
    free(s->files);
    free(s->config_json);
    memset(s, 0, sizeof *s);
}

const FileDigest *ckpt_state_digest(const CkptState *s, const char *name) {
    for (int i = 0; i < s->n_files; i++)
        if (strcmp(s->files[i].name, name) == 0) return &s->files[i].digest;
    return NULL;
}
