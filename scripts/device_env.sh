# Sourced on a GPU machine that lacks the -dev packages: points make and the loader at .deps/
# (made by scripts/device_deps.sh and carried with the run). Keeps NCCL's NVLink multicast off.
D=$PWD/.deps
export CFLAGS_EXTRA="-I$D/include" OPENBLAS_INC="$D/include/openblas"
export LDFLAGS_EXTRA="-L$D/lib -Wl,-rpath,$D/lib"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
