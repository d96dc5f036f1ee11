// Runs `train_gpt prepare` through prepare_main alone, for tests/test_prepare.py when the
// train_gpt binary is not built.
#include "data/prepare.h"

int main(int argc, char **argv) { return prepare_main(argc, argv); }
