// fuzz_llmc: llm.c's model file (convert_read_llmc_stream: the header, its sizes against the
// config table's ranges and against the file's size, the fp32 or bf16 parameters). Input: a
// model file, read through a memory stream. Promise: an accepted file fills a model whose
// parameter count matches the header's.
#include "common/check.h"
#include "convert/convert.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;   // fmemopen needs a buffer of at least one byte
    FILE *f = fmemopen((void *)data, size, "rb");
    FUZZ_ASSERT(f != NULL);
    char err[ERR_LEN];
    HostModel hm;
    const int rc = convert_read_llmc_stream(f, (long long)size, "fuzz.bin", &hm, err, sizeof err);
    fclose(f);
    if (rc != 0) {
        FUZZ_ASSERT(err[0] != '\0');
        return 0;
    }
    const Config *c = &hm.cfg;
    FUZZ_ASSERT(c->model.n_embd % c->model.n_head == 0 && gpt_num_params(hm.model) > 0);
    convert_model_free(&hm);
    return 0;
}
