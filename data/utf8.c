#include "data/utf8.h"

int utf8_encode(uint32_t cp, char out[UTF8_MAX_BYTES]) {
    static const unsigned char lead[UTF8_MAX_BYTES + 1] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (int i = n - 1; i > 0; i--, cp >>= 6) out[i] = (char)(0x80 | (cp & 0x3F));
    out[0] = (char)(lead[n] | cp);
    return n;
}

uint32_t utf8_decode(const char *p, int len) {
    static const unsigned char payload[UTF8_MAX_BYTES + 1] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = (unsigned char)p[0] & payload[len];
    for (int i = 1; i < len; i++) cp = cp << 6 | ((unsigned char)p[i] & 0x3F);
    return cp;
}
