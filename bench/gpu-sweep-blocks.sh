#!/usr/bin/env bash
# Probe on a GPU machine: the tile kernels' blocks per multiprocessor
# (DISTRO__CUDA_BLOCKS_PER_SM, a build-time knob of src/cuda/optim_cuda.c),
# one build per value in /tmp/bB, each timed with bench_cuda_step (1.2B
# Llama-2 shapes, exact DCT, wire v2) and checked with test_cuda_step.
#
#   SWEEP="2 3 4 6 8" bench/gpu-sweep-blocks.sh     from the repository root
#
# Needs what bench/gpu-check.sh needs (nvcc, cmake, ninja, OpenBLAS, NCCL
# where the CUDA toolkit has it). Prints the step table's rows per value.
set -u
export PATH=/usr/local/cuda/bin:$PATH
for B in ${SWEEP:-2 3 4 6 8}; do
  d=/tmp/b$B
  cmake -S . -B "$d" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTRO_CUDA=ON -DDISTRO_TESTS=OFF -DDISTRO_CUDA_TESTS=ON \
    -DDISTRO_EXAMPLES=OFF -DDISTRO_MPI=OFF "-DCMAKE_C_FLAGS=-DDISTRO__CUDA_BLOCKS_PER_SM=$B" >"$d.conf" 2>&1 ||
    { echo "B=$B configure failed"; tail -5 "$d.conf"; continue; }
  cmake --build "$d" -j "$(nproc)" --target bench_cuda_step test_cuda_step >"$d.build" 2>&1 ||
    { echo "B=$B build failed"; tail -5 "$d.build"; continue; }
  echo "== B=$B"
  timeout 60 "$d/bench/bench_cuda_step" --chunk 64 --topk 32 --values f32 --wire 2 --dct exact --steps 4 --warmup 1 |
    sed -n '/== table/,/== end/p' | grep -E 'transform|decode|step total'
  (cd "$d" && timeout 60 ctest -R test_cuda_step 2>&1 | grep -E 'tests passed|Failed|Passed')
done
