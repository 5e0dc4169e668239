#!/usr/bin/env bash
# Issue 31's GPU checks in one call of about 6 minutes on one H100 / H200 (run from the
# repository's source: the GPU machine has its own torch, timm, torchvision and NVML):
#   1. the CUDA tests of the image path (device-side finish, --gpu-decode's stream, host syncs
#      per epoch, the checkpoint's copy to the host);
#   2. the checkpoint stall on the GPU (the state's copy to the host, in the training thread);
#   3. benchmarks/gpu_throughput.py at batch 32 (ceiling, bare loop, spmlkit, spmlkit with
#      --gpu-decode, spmlkit with the pre-issue float32 workers: speed and the seeded val /
#      test mAP difference), then batch 8 (ceiling, bare, spmlkit).
#   bash benchmarks/gpu_images.sh OUT_DIR [BUDGET_SECONDS of step 3, default 300]
set -uo pipefail
out=${1:?give the folder for the results}
budget=${2:-300}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
python -m pytest -q -o addopts= -rs tests/test_image_device_steps.py tests/test_checkpointer.py \
    2>&1 | tail -15
python benchmarks/checkpoint_stall.py --device cuda --epochs 3 --repeats 1 \
    --out "$out/checkpoint-stall-gpu.csv"
python benchmarks/gpu_throughput.py --out "$out/gpu-throughput-b32.csv" --batches 32 \
    --paths ceiling,bare,spmlkit,spmlkit+gpu-decode,spmlkit+float-workers \
    --budget "$budget"
python benchmarks/gpu_throughput.py --out "$out/gpu-throughput-b8.csv" --batches 8 \
    --paths ceiling,bare,spmlkit --budget 150
