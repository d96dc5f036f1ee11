#include "common/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

int metrics_open(Metrics *m, const char *dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    m->f = fopen(path, "a");
    if (!m->f) {
        snprintf(err, errlen, "cannot open '%s' for writing: %s (is log.dir writable?)", path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

void metrics_close(Metrics *m) {
    if (m->f) fclose(m->f);
    m->f = NULL;
}

void metrics_write(Metrics *m, const char *event, long long step, ...) {
    if (!m->f) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", event);
    cJSON_AddNumberToObject(o, "step", (double)step);
    va_list ap;
    va_start(ap, step);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        int kind = va_arg(ap, int);
        if (kind == 'd') {
            double v = va_arg(ap, double);
            // JSON has no inf/nan: write them as strings so the line stays valid.
            if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
            else cJSON_AddStringToObject(o, key, isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
        } else if (kind == 'i') {
            cJSON_AddNumberToObject(o, key, (double)va_arg(ap, long long));
        } else {
            cJSON_AddStringToObject(o, key, va_arg(ap, const char *));
        }
    }
    va_end(ap);
    char *line = cJSON_PrintUnformatted(o);
    fprintf(m->f, "%s\n", line);
    fflush(m->f);
    cJSON_free(line);
    cJSON_Delete(o);
}
