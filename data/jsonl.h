// jsonl: the text of one JSON Lines record. A validating reader of one line of JSON (RFC 8259)
// that decodes only the string of the named top-level field and skips everything else without
// allocating. Strings must be valid UTF-8 and escapes well formed (a lone surrogate such as
// \ud800 is refused: it has no UTF-8 form); \u0000 decodes to a NUL byte inside the text.
#pragma once
#include <stddef.h>

#include "data/bytebuf.h"

typedef enum {
    JSONL_TEXT = 0,    // out holds the field's decoded string
    JSONL_BLANK = 1,   // the line is empty or only whitespace
    JSONL_BAD = -1,    // err says why (the byte offset inside the line, or the field's type)
} JsonlResult;

// Reads line (len bytes, without its '\n'; a trailing '\r' is whitespace) as one JSON object and
// sets out to the string value of its member `field` (the last one when the key repeats, as
// Python's json module does). A missing field, a value that is not a string, or any syntax error
// is JSONL_BAD.
JsonlResult jsonl_field_text(const char *line, size_t len, const char *field, ByteBuf *out, char *err,
                             size_t errlen);
