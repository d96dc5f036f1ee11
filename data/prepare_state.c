#include "data/prepare_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"
#include "data/bytebuf.h"

#define STATE_VERSION 1

// The counters and the position, each a JSON number (exact below 2^53, far above any offset).
#define STATE_FIELDS(X)                                                               \
    X(started) X(in_val) X(complete) X(skip_tokens) X(docs) X(val_tokens)            \
    X(train_tokens) X(raw_done) X(val_shards) X(train_shards)
#define POS_FIELDS(X) X(file) X(offset) X(doc_offset) X(text_offset) X(line)

int prepare_state_save(const char *path, const cJSON *settings, const PrepareState *s, char *err, size_t errlen) {
    cJSON *root = cJSON_CreateObject(), *pos = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "version", STATE_VERSION);
    cJSON_AddItemToObject(root, "settings", cJSON_Duplicate(settings, 1));
#define ADD(f) cJSON_AddNumberToObject(root, #f, (double)s->f);
    STATE_FIELDS(ADD)
#undef ADD
#define ADD(f) cJSON_AddNumberToObject(pos, #f, (double)s->pos.f);
    POS_FIELDS(ADD)
#undef ADD
    cJSON_AddItemToObject(root, "position", pos);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    int rc = write_file_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

// Which setting differs between the saved and the current run, as a message.
static int compare_settings(const char *path, const cJSON *saved, const cJSON *now, char *err, size_t errlen) {
    for (const cJSON *want = now->child; want; want = want->next) {
        const cJSON *had = cJSON_GetObjectItemCaseSensitive(saved, want->string);
        if (had && cJSON_Compare(had, want, 1)) continue;
        char *a = had ? cJSON_PrintUnformatted(had) : NULL, *b = cJSON_PrintUnformatted(want);
        set_error(err, errlen, "cannot --resume from '%s': %s was %.300s in the interrupted run and is %.300s "
                               "now; rerun it as it was, or remove the output files to start over",
                  path, want->string, a ? a : "(not recorded)", b);
        free(a);
        free(b);
        return -1;
    }
    return 0;
}

static int number(const cJSON *obj, const char *key, double *v) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(n) || n->valuedouble < 0 || n->valuedouble != floor(n->valuedouble)) return -1;
    *v = n->valuedouble;
    return 0;
}

int prepare_state_load(const char *path, const cJSON *settings, PrepareState *s, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return set_error(err, errlen, "cannot read '%s'", path);
    ByteBuf b = {0};
    size_t got;
    do {
        bytebuf_reserve(&b, 4096);
        got = fread(b.p + b.len, 1, 4096, f);
        b.len += got;
    } while (got > 0);
    fclose(f);
    bytebuf_append(&b, "", 1);
    char *text = b.p;
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = -1;
    double v, version;
    const cJSON *saved = cJSON_GetObjectItemCaseSensitive(root, "settings");
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(root, "position");
    memset(s, 0, sizeof *s);
    if (!root || number(root, "version", &version) != 0 || version != STATE_VERSION || !cJSON_IsObject(saved) ||
        !cJSON_IsObject(pos)) {
        set_error(err, errlen, "'%s' is not a state file of this version of prepare: remove the output files to start over",
                  path);
        goto done;
    }
    if (compare_settings(path, saved, settings, err, errlen) != 0) goto done;
#define GET(f) if (number(root, #f, &v) != 0) goto corrupt; s->f = (__typeof__(s->f))v;
    STATE_FIELDS(GET)
#undef GET
#define GET(f) if (number(pos, #f, &v) != 0) goto corrupt; s->pos.f = (__typeof__(s->pos.f))v;
    POS_FIELDS(GET)
#undef GET
    rc = 0;
    goto done;
corrupt:
    set_error(err, errlen, "'%s' is damaged (a field is missing or not a count): remove the output files to start over",
              path);
done:
    cJSON_Delete(root);
    return rc;
}
