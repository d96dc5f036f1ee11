# flashgpt build. `make` builds train_gpt (CUDA backend too when nvcc is found; NO_CUDA=1 skips
# it), `make test` runs the CPU test suite and the PyTorch oracle tests (`make test-docs` only the
# commands the docs show), `make test-gpu` the GPU tests, `make libattention` the attention
# kernels as a shared library for the Python package (python/flashgpt, docs/python.md) and
# scripts/bench_attention.py.
# `make test-asan` runs the C tests and the CLI tests under AddressSanitizer and UBSan, `make fuzz`
# builds the libFuzzer harnesses (tests/fuzz/) and `make fuzz-run` runs each for FUZZ_SECONDS,
# `make test-gpu-sanitize` runs the GPU tests' quick subsets under compute-sanitizer.
CC      ?= gcc
PYTHON  ?= /usr/bin/python3
BUILD   ?= build
BIN     ?= train_gpt
OPENBLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-pthread
CFLAGS  = -O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -fPIC -I. \
          -I$(OPENBLAS_INC) $(CFLAGS_EXTRA)
LDLIBS  = -lcjson -lpcre2-8 -lz -lzstd -lopenblas -lm -lpthread $(LDFLAGS_EXTRA)

# One layer per folder (docs/ARCHITECTURE.md says what each may include; make check-deps checks it).
MODULES := common attention model model/cpu model/cuda optim data dist trainer convert
C_SRC   := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))
CU_SRC  := $(foreach m,$(MODULES),$(wildcard $(m)/*.cu))
C_OBJ    = $(C_SRC:%.c=$(BUILD)/%.o)
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
# The subcommands besides train (cli/) link into train_gpt only, not into the library tests use.
CLI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cli/*.c))

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(NO_CUDA),1)
NVCC :=
endif
ifneq ($(NVCC),)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH  ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
NVCCFLAGS  = -O3 -std=c++17 -I. $(CUDA_ARCH) -lineinfo --expt-relaxed-constexpr \
             -Xcompiler -fPIC,-fopenmp -DFLASHGPT_CUDA $(NVCCFLAGS_EXTRA) $(CFLAGS_EXTRA)
CFLAGS    += -DFLASHGPT_CUDA -I$(CUDA_HOME)/include
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
OBJ        = $(C_OBJ) $(CU_OBJ)
else
OBJ        = $(C_OBJ)
endif

# Data parallelism (dist/): MPI for the CPU backend's collectives when mpicc is found (NO_MPI=1
# skips it), NCCL for the GPUs when building with CUDA and the toolkit has nccl.h.
MPICC ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(NO_MPI),1)
MPICC :=
endif
ifneq ($(MPICC),)
CFLAGS    += -DFLASHGPT_MPI $(shell $(MPICC) --showme:compile)
DIST_LIBS += $(shell $(MPICC) --showme:link)
else
C_SRC     := $(filter-out dist/comm_mpi.c,$(C_SRC))
endif
# NCCL_INC: where nccl.h is (the toolkit's include directory unless set, as scripts/device_env.sh
# does on a machine whose NCCL came with PyTorch).
NCCL_INC  ?= $(CUDA_HOME)/include
ifneq ($(and $(NVCC),$(wildcard $(NCCL_INC)/nccl.h)),)
CFLAGS    += -DFLASHGPT_NCCL -I$(NCCL_INC)
DIST_LIBS += -L$(CUDA_HOME)/lib64 -lnccl
else
C_SRC     := $(filter-out dist/comm_nccl.c,$(C_SRC))
endif
# OpenSSL's libcrypto: the TCP bootstrap's hello proof (HMAC-SHA256, dist/bootstrap_tcp.c) and
# the checkpoints' SHA-256 checksums (common/digest.c).
DIST_LIBS += -lcrypto
LDLIBS    += $(DIST_LIBS)

# Objects depend on the flags they were built with: switching between a CUDA and a NO_CUDA=1
# build (or changing CFLAGS_EXTRA) rebuilds them instead of linking stale ones.
BUILD_FLAGS := $(CC) $(CFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDLIBS)
$(shell mkdir -p $(BUILD) && (echo '$(BUILD_FLAGS)' | cmp -s - $(BUILD)/flags || echo '$(BUILD_FLAGS)' > $(BUILD)/flags))

TEST_SRC     := $(wildcard tests/test_*.c)
TEST_HDR     := $(wildcard tests/*.h)   # the harness headers the C tests share
TEST_BIN     := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Small programs the Python oracle tests drive (they link the same library as train_gpt).
TOOL_SRC     := $(wildcard tests/tools/*.c)
TOOL_BIN     := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/tools/%)
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c tests/gpu/test_*.cu)
GPU_TEST_BIN := $(patsubst tests/gpu/%,$(BUILD)/tests/gpu/%,$(basename $(GPU_TEST_SRC)))
# Fuzz harnesses (tests/fuzz/fuzz.h): each links with libFuzzer (make fuzz) or with the replay
# driver, which runs its seed corpus and crash regressions once (part of make test).
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_HDR     := $(wildcard tests/fuzz/*.h)
REPLAY_BIN   := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/tests/fuzz/replay_%)

# `make` prints one short line per target; V=1 prints the commands.
ifeq ($(V),1)
Q :=
say :=
else
Q := @
say = @printf '  %-6s %s\n' $(1) '$(2)';
endif

.PHONY: all test test-docs test-gpu test-gpu-dist test-gpu-sanitize test-asan asan-run fuzz fuzz-bins fuzz-run \
        bench libattention check-deps clean
all: $(BIN)

# Each object lists the headers it includes in a .d file beside it (-MMD), so editing a header
# rebuilds only the objects that include it.
$(BUILD)/%.o: %.c $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(BUILD)/train_gpt.d

$(BUILD)/libflashgpt.a: $(OBJ)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $^

$(BIN): $(BUILD)/train_gpt.o $(CLI_OBJ) $(BUILD)/libflashgpt.a
	$(call say,LINK,$@)$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_HDR) $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,TEST,$@)$(CC) $(CFLAGS) $< $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

$(BUILD)/tests/tools/%: tests/tools/%.c $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,TOOL,$@)$(CC) $(CFLAGS) $< $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(TEST_HDR) tests/gpu/cuda_ok.h $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,TEST,$@)$(CC) $(CFLAGS) $< $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.cu $(TEST_HDR) tests/gpu/cuda_ok.h $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,TEST,$@)$(NVCC) $(NVCCFLAGS) -c $< -o $@.o
	$(Q)$(CC) $(CFLAGS) $@.o $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

$(BUILD)/tests/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_HDR) $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,TEST,$@)$(CC) $(CFLAGS) -DFUZZ_NAME='"$*"' $< tests/fuzz/replay.c $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_HDR) $(BUILD)/libflashgpt.a
	@mkdir -p $(dir $@)
	$(call say,FUZZ,$@)$(CC) $(CFLAGS) -fsanitize=fuzzer $< $(BUILD)/libflashgpt.a -o $@ $(LDLIBS)

# The attention module alone as a shared library (C API of attention/attention.h), for ctypes.
# It needs only common/check.o, common/dtype.o and common/rng.o (the block patterns' random
# blocks) from the rest of common (no cJSON, so it loads on machines without it); -fopenmp
# links libgomp for the CPU reference's parallel loops.
libattention: $(BUILD)/libattention.so
$(BUILD)/libattention.so: $(filter $(BUILD)/attention/%,$(OBJ)) $(BUILD)/common/check.o $(BUILD)/common/dtype.o \
                          $(BUILD)/common/rng.o
	$(call say,LINK,$@)$(CC) -shared -fopenmp $^ -o $@ $(LDLIBS)

# Every #include against the layer rules of docs/ARCHITECTURE.md.
check-deps:
	@$(PYTHON) scripts/check_deps.py

# The Python package's tests load this build's libattention.so (FLASHGPT_LIBATTENTION); the GPU
# one imports the package from python/ with the machine's PyTorch.
LIBATTENTION_ENV = FLASHGPT_LIBATTENTION=$(abspath $(BUILD))/libattention.so
test: check-deps $(BIN) $(TEST_BIN) $(TOOL_BIN) $(REPLAY_BIN) $(BUILD)/libattention.so
	@$(LIBATTENTION_ENV) bash tests/run_tests.sh $(TEST_BIN) $(REPLAY_BIN)

# The commands README.md and docs/ show, each run on tiny inputs or listed with the reason it is
# not (tests/test_doc_commands.py, part of make test), alone.
test-docs: $(BIN) $(TOOL_BIN)
	$(call say,PYTEST,tests/test_doc_commands.py)$(PYTHON) -m pytest -q -p no:cacheprovider tests/test_doc_commands.py

test-gpu: $(BIN) $(GPU_TEST_BIN) $(BUILD)/libattention.so
	@$(LIBATTENTION_ENV) PYTHONPATH=$(CURDIR)/python bash tests/run_tests.sh --gpu $(GPU_TEST_BIN) \
	    tests/gpu/test_python_api_gpu.py

# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over each GPU test's --quick
# subset (scripts/gpu_sanitize.sh; logs in $(BUILD)/gpu_sanitize/).
test-gpu-sanitize: $(GPU_TEST_BIN)
	@bash scripts/gpu_sanitize.sh $(BUILD) $(GPU_TEST_BIN)

# Sanitizers on the CPU backend, in a build of their own (ASAN_BUILD): the C tests, the fuzz
# corpora and regressions replayed, and the CLI tests of ASAN_PYTEST against that train_gpt
# (test_train_cli.py without its dropout resume, two minutes under ASan on two cores for what the
# plain resume test covers, without the plot script, which is Python alone, and without the copy
# proof's, whose script runs ./train_gpt, not this build; all three run in make test).
# MPI stays out (NO_MPI=1: Open MPI's own allocations and threads are not instrumented, and its
# tests need the binary under mpirun), so do the two-rank tests; OpenMP runs as usual.
ASAN_BUILD  ?= build/asan
SAN_FLAGS   := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_PYTEST ?= tests/test_train_cli.py tests/test_stop.py tests/test_checksums.py tests/test_divergence.py \
               --deselect tests/test_train_cli.py::test_resume_with_dropout_is_bitwise_exact \
               --deselect tests/test_train_cli.py::test_plot_metrics_writes_png \
               --deselect tests/test_train_cli.py::test_copy_proof \
               --deselect tests/test_stop.py::test_two_ranks_stop_after_the_same_step_when_one_is_signalled \
               --deselect tests/test_checksums.py::test_two_ranks_agree_to_skip_a_shard_only_one_reads
test-asan:
	@$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) BIN=$(ASAN_BUILD)/train_gpt NO_CUDA=1 NO_MPI=1 \
	    CFLAGS_EXTRA="$(SAN_FLAGS)" asan-run
# test_model_cpu stays out: its finite-difference checks take minutes under ASan on two cores,
# and the CLI tests run the same model code (forward, backward, AdamW, decode) through train_gpt.
ASAN_TEST_BIN = $(filter-out $(BUILD)/tests/test_model_cpu,$(TEST_BIN))
asan-run: $(BIN) $(ASAN_TEST_BIN) $(REPLAY_BIN)
	@ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TRAIN_GPT=$(BIN) FLASHGPT_NO_MPI=1 \
	    PYTEST_ARGS="$(ASAN_PYTEST)" bash tests/run_tests.sh $(ASAN_TEST_BIN) $(REPLAY_BIN)

# libFuzzer harnesses with clang (FUZZ_CC), AddressSanitizer and UBSan, in FUZZ_BUILD; fuzz-run
# runs each for FUZZ_SECONDS from its seed corpus and replays its crash regressions
# (tests/fuzz/run.sh; what a run finds lands in $(FUZZ_BUILD)/findings/).
FUZZ_CC      ?= $(shell command -v clang-14 2>/dev/null || command -v clang 2>/dev/null)
FUZZ_BUILD   ?= build/fuzz
FUZZ_SECONDS ?= 20
fuzz:
	@test -n "$(FUZZ_CC)" || { echo "make fuzz needs clang with libFuzzer (scripts/setup.sh installs clang-14)"; exit 2; }
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) NO_CUDA=1 NO_MPI=1 \
	    CFLAGS_EXTRA="$(SAN_FLAGS) -fsanitize=fuzzer-no-link -Wno-unknown-warning-option -Wno-pass-failed" fuzz-bins
fuzz-bins: $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/%)
fuzz-run: fuzz
	@bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# Data parallelism on 2 GPUs of one host: NCCL under torchrun and mpirun, faults.
test-gpu-dist: $(BIN)
	$(call say,PYTEST,tests/gpu/test_dist_gpu.py)$(PYTHON) -m pytest -s -q -p no:cacheprovider tests/gpu/test_dist_gpu.py

bench: $(BIN)
	$(call say,BENCH,$(BIN))./$(BIN) bench

clean:
	$(call say,CLEAN,$(BUILD) $(BIN))rm -rf $(BUILD) $(BIN)
