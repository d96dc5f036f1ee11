// peak_flops: the MFU denominator for the GPU a run is on. Dense bf16/fp16 tensor-core peaks
// without sparsity, from NVIDIA's datasheets (SXM parts unless the name says otherwise).
#include <string.h>

#include "cli/cli.h"

typedef struct {
    const char *name;   // a substring of the device name; the first match wins (longer first)
    double flops;
} NamedPeak;

static const NamedPeak BY_NAME[] = {
    {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H200", 989e12},  {"H100", 989e12},
    {"H800", 989e12},      {"GH200", 989e12},    {"B200", 2250e12}, {"A100", 312e12},
    {"A800", 312e12},      {"A40", 150e12},      {"A10", 125e12},   {"L40S", 362e12},
    {"L40", 181e12},       {"L4", 121e12},
};

typedef struct {
    int cc;             // 10 * major + minor
    double flops;
} CcPeak;

// The data-centre part of each compute capability, for GPUs the name table lacks.
static const CcPeak BY_CC[] = {{80, 312e12}, {90, 989e12}, {100, 2250e12}};

double cli_peak_flops(const Backend *be) {
    if (be->device != DEVICE_CUDA) return 0.0;
    for (size_t i = 0; i < sizeof BY_NAME / sizeof BY_NAME[0]; i++)
        if (strstr(be->device_name, BY_NAME[i].name)) return BY_NAME[i].flops;
    for (size_t i = 0; i < sizeof BY_CC / sizeof BY_CC[0]; i++)
        if (BY_CC[i].cc == be->compute_capability) return BY_CC[i].flops;
    return 0.0;
}
