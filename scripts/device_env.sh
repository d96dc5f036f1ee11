# Sourced on a GPU machine that lacks the -dev packages: points make and the loader at .deps/
# (made by scripts/device_deps.sh and carried with the run). Keeps NCCL's NVLink multicast off.
D=$PWD/.deps
export CFLAGS_EXTRA="-I$D/include" OPENBLAS_INC="$D/include/openblas"
export LDFLAGS_EXTRA="-L$D/lib -Wl,-rpath,$D/lib"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
# NCCL: the toolkit's when it has one; else the library PyTorch brought (pip's nvidia-nccl),
# linked through .deps/lib and compiled against the header .deps carries (NCCL's ABI is stable
# within 2.x).
cuda_home=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
if [ ! -f "$cuda_home/include/nccl.h" ] && [ -f "$D/include/nccl.h" ]; then
    lib=$(python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [ -f "$lib" ] || lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
    if [ -f "$lib" ]; then
        ln -sf "$lib" "$D/lib/libnccl.so.2" && ln -sf libnccl.so.2 "$D/lib/libnccl.so"
        export NCCL_INC="$D/include"
    else
        echo "device_env.sh: no libnccl.so.2 found: building without NCCL" >&2
    fi
fi
# libcrypto (the TCP bootstrap's HMAC): the machine's own libcrypto.so.3 when it has one, since
# a second copy on LD_LIBRARY_PATH would be loaded beside the machine's libssl (Python's ssl
# module) whatever their versions; else the one .deps carries.
crypto=$(ldconfig -p | awk '$1 == "libcrypto.so.3" && /x86-64/ {print $NF; exit}')
if [ ! -f "$crypto" ]; then
    crypto=$D/crypto/libcrypto.so.3
    ln -sf "$crypto" "$D/lib/libcrypto.so.3"
fi
ln -sf "$crypto" "$D/lib/libcrypto.so"
# The tests' Python: the one on PATH (on the GPU machines it holds PyTorch, numpy and pytest).
PYTHON=$(command -v python3) && export PYTHON
