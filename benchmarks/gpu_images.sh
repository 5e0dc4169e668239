#!/usr/bin/env bash
# Issue 31's GPU checks in one call of about 7-8 minutes on one H100 / H200 (run from the
# repository's source: the GPU machine has its own torch, timm, torchvision and NVML):
#   1. the CUDA tests of the image path (device-side finish, --gpu-decode's stream, host syncs
#      per epoch, the checkpoint's copy to the host);
#   2. the checkpoint stall on the GPU (the state's copy to the host, in the training thread);
#   3. benchmarks/gpu_throughput.py at batch 32 (ceiling, bare loop, spmlkit, spmlkit with
#      --gpu-decode, the same decoded in the training thread: what the decode thread gains;
#      wait_s tells a loader behind from the steps' own host work, the *_cpu_s columns which
#      thread is short of CPU; the loader workers with glibc's malloc defaults, as before
#      spmlkit.machine.loader_worker_init), then batch 8 (ceiling,
#      bare, spmlkit). The pre-issue float32 workers' seeded mAP (the same as spmlkit's on an
#      H100, results/gpu-throughput.csv call 4) is --paths spmlkit+float-workers.
#   Measured with this script: calls 4 and 5 of results/gpu-throughput.csv (422 s on an H100).
#   bash benchmarks/gpu_images.sh OUT_DIR [BUDGET_SECONDS of step 3, default 340]
set -uo pipefail
out=${1:?give the folder for the results}
budget=${2:-340}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
python -m pytest -q -o addopts= -rs tests/test_image_device_steps.py tests/test_checkpointer.py \
    2>&1 | tail -15
python benchmarks/checkpoint_stall.py --device cuda --epochs 3 --repeats 1 \
    --out "$out/checkpoint-stall-gpu.csv"
python benchmarks/gpu_throughput.py --out "$out/gpu-throughput-b32.csv" --batches 32 \
    --paths ceiling,bare,spmlkit,spmlkit+gpu-decode,spmlkit+gpu-decode-inline,spmlkit+glibc-malloc \
    --budget "$budget"
python benchmarks/gpu_throughput.py --out "$out/gpu-throughput-b8.csv" --batches 8 \
    --paths ceiling,bare,spmlkit --budget 150
