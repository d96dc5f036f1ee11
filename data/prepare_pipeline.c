#include "data/prepare_pipeline.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

#define PIPELINE_FEED_BYTES (1u << 20)   // a long JSONL document joins the batch this much at a time

typedef struct {
    Pipeline *pl;
    int resumed;       // the next segment is the one the state points into
    IdBuf ids;
    size_t *counts;    // (cap_counts) ids per segment of the batch
    size_t cap_counts;
} Run;

static int save_state(Pipeline *pl, const Segment *at, uint64_t skip, char *err, size_t errlen) {
    PrepareState *st = &pl->st;
    if (at) {   // else the position stays: the start (nothing written yet) or the end (complete)
        st->started = 1;
        st->pos = at->pos;
        st->skip_tokens = skip;
    }
    st->val_tokens = pl->val.tokens;
    st->train_tokens = pl->train.tokens;
    st->val_shards = pl->val.done;
    st->train_shards = pl->train.done;
    st->raw_done = pl->doc_stats.raw_done;
    return prepare_state_save(pl->state_path, pl->settings, st, err, errlen);
}

static int val_is_full(const Pipeline *pl, const Segment *s) {
    if (pl->val_by_tokens) return pl->val.tokens >= pl->val_goal_tokens;
    return pl->val.tokens > 0 && s->raw_pos >= pl->val_goal_bytes;
}

// The ids of one segment into the split its document belongs to.
static int route(Run *r, const Segment *s, const int *ids, size_t n, char *err, size_t errlen) {
    Pipeline *pl = r->pl;
    size_t done = 0;
    if (r->resumed) {   // this segment's document was counted and placed before the interruption
        r->resumed = 0;
        done = (size_t)pl->st.skip_tokens;
        if (done > n) return set_error(err, errlen, "the input differs from the interrupted run: it gives fewer tokens");
    } else if (s->doc_start) {
        pl->st.docs++;
        if (!pl->single && pl->st.in_val && val_is_full(pl, s)) {
            if (shard_set_finish(&pl->val, 1, err, errlen) != 0) return -1;
            pl->st.in_val = 0;
            if (save_state(pl, s, 0, err, errlen) != 0) return -1;
        }
    }
    if (pl->single) pl->st.in_val = s->part == 1;
    ShardSet *dst = pl->st.in_val ? &pl->val : &pl->train;
    while (done < n) {
        size_t k;
        if (shard_set_write(dst, ids + done, n - done, &k, err, errlen) != 0) return -1;
        done += k;
        if (!shard_set_full(dst)) continue;
        if (pl->single)
            return set_error(err, errlen, "'%s.bin' would hold more than %d tokens, the most one shard holds: give "
                                          "--shard-tokens N to write numbered shards", dst->base, INT32_MAX);
        if (shard_set_finish(dst, 1, err, errlen) != 0 || save_state(pl, s, done, err, errlen) != 0) return -1;
    }
    return 0;
}

// Encodes the batch's closed segments and routes their ids.
static int flush(Run *r, Batch *b, char *err, size_t errlen) {
    Pipeline *pl = r->pl;
    if (b->n == 0) return 0;
    if (b->n > r->cap_counts) r->counts = xrealloc(r->counts, (r->cap_counts = 2 * b->n) * sizeof(size_t));
    if (segments_encode(&pl->enc, b->text.p, b->seg, b->n, &r->ids, r->counts, err, errlen) != 0) return -1;
    const int *ids = r->ids.p;
    for (size_t i = 0; i < b->n; i++) {
        const Segment *s = &b->seg[i];
        if (s->hard_cut && pl->hard_cuts++ == 0 && pl->log)
            fprintf(pl->log, "warning: prepare: '%s' has %u MB without a place where GPT-2's pre-tokenizer "
                             "always splits (near byte %llu); cut there, so the ids at the cut may differ from "
                             "encoding the whole document at once\n",
                    pl->in->files[s->pos.file].path, PIPELINE_SEGMENT_MAX >> 20,
                    (unsigned long long)(s->pos.offset + s->len));
        pl->text_bytes += s->len;
        if (route(r, s, ids, r->counts[i], err, errlen) != 0) return -1;
        ids += r->counts[i];
    }
    batch_clear_closed(b);
    return 0;
}

static void report_progress(Pipeline *pl, const DocStream *ds) {
    if (!pl->progress) return;
    pl->doc_stats = doc_stream_stats(ds);
    progress_update(pl->progress, "tokenizing", pl->doc_stats.raw_done, pl->val.tokens + pl->train.tokens,
                    pl->val.done + pl->train.done);
}

// Feeds one piece to the batch, a slice at a time, flushing whenever the batch is full.
static int feed(Run *r, Batch *b, const DocPiece *p, char *err, size_t errlen) {
    size_t off = 0;
    do {
        DocPiece part = *p;
        size_t k = p->len - off < PIPELINE_FEED_BYTES ? p->len - off : PIPELINE_FEED_BYTES;
        part.text = p->text + off;
        part.len = k;
        part.doc_start = p->doc_start && off == 0;
        part.doc_end = p->doc_end && off + k == p->len;
        part.pos = doc_pos_advance(p->pos, r->pl->docs.format, off);
        batch_add(b, &part);
        if (batch_closed_bytes(b) >= r->pl->batch_bytes && flush(r, b, err, errlen) != 0) return -1;
        off += k;
    } while (off < p->len);
    return 0;
}

int pipeline_run(Pipeline *pl, char *err, size_t errlen) {
    Run r = {.pl = pl, .resumed = pl->st.started};
    if (!pl->batch_bytes) {
        size_t threads = (size_t)(pl->enc.threads > 0 ? pl->enc.threads : omp_get_max_threads());
        size_t want = threads * 4 * pl->seg.target;
        pl->batch_bytes = want < PIPELINE_BATCH_MIN ? PIPELINE_BATCH_MIN : want > PIPELINE_BATCH_MAX ? PIPELINE_BATCH_MAX : want;
    }
    pl->val.done = pl->st.val_shards;
    pl->val.tokens = pl->st.val_tokens;
    pl->train.done = pl->st.train_shards;
    pl->train.tokens = pl->st.train_tokens;
    DocStream *ds = doc_stream_open(pl->in, &pl->docs);
    Batch b;
    batch_init(&b, &pl->seg);
    int rc = pl->st.started ? doc_stream_seek(ds, &pl->st.pos, err, errlen) : 0;
    if (rc == 0 && !pl->single && !pl->st.started) rc = save_state(pl, NULL, 0, err, errlen);
    DocPiece p;
    while (rc == 0 && (rc = doc_stream_next(ds, &p, err, errlen)) == 1) {
        rc = feed(&r, &b, &p, err, errlen);
        report_progress(pl, ds);
    }
    if (rc == 0) rc = flush(&r, &b, err, errlen);
    pl->doc_stats = doc_stream_stats(ds);
    pl->all_val = rc == 0 && !pl->single && (pl->st.in_val || pl->train.tokens == 0);
    if (pl->all_val && pl->val.tokens + pl->train.tokens == 0)
        rc = set_error(err, errlen, "the input holds no text to tokenize (%llu JSONL lines, %llu malformed; %llu "
                                    "empty documents)", (unsigned long long)pl->doc_stats.lines,
                       (unsigned long long)pl->doc_stats.bad_lines, (unsigned long long)pl->doc_stats.empty_docs);
    else if (pl->all_val)
        rc = set_error(err, errlen, "every document went to val (%llu tokens): nothing is left for train; lower "
                                    "--val-tokens or --val-fraction, or give more input",
                       (unsigned long long)pl->val.tokens);
    if (rc == 0) rc = shard_set_finish(&pl->val, !pl->single, err, errlen);
    if (rc == 0) rc = shard_set_finish(&pl->train, !pl->single, err, errlen);
    if (rc == 0 && !pl->single) {
        pl->st.complete = 1;
        rc = save_state(pl, NULL, 0, err, errlen);
    }
    if (rc != 0) {
        shard_set_discard(&pl->val);
        shard_set_discard(&pl->train);
    }
    batch_free(&b);
    doc_stream_close(ds);
    free(r.ids.p);
    free(r.counts);
    return rc;
}
