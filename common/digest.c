#include "common/digest.h"

#include <openssl/evp.h>
#include <stdio.h>

#include "common/check.h"

void sha256_begin(Sha256 *s) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    CHECK(ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    s->ctx = ctx;
    s->size = 0;
}

void sha256_update(Sha256 *s, const void *data, size_t n) {
    if (n) CHECK(EVP_DigestUpdate(s->ctx, data, n) == 1);
    s->size += n;
}

void sha256_end(Sha256 *s, FileDigest *out) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    CHECK(EVP_DigestFinal_ex(s->ctx, md, &len) == 1 && len * 2 == SHA256_HEX_LEN);
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
    for (unsigned int i = 0; i < len; i++) snprintf(out->sha256 + 2 * i, 3, "%02x", md[i]);
    out->size = s->size;
}

void sha256_buffer(const void *data, size_t n, FileDigest *out) {
    Sha256 s;
    sha256_begin(&s);
    sha256_update(&s, data, n);
    sha256_end(&s, out);
}
