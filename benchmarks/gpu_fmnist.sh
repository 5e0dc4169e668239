#!/usr/bin/env bash
# The GPU runs quoted in the README (one CUDA GPU): the CUDA tests, fine-tuning EfficientNet-Lite0
# end to end on fmnist_mosaic (AMP + channels-last), and LAC's Table 3 rows with the backbone
# fine-tuned (views=images, d = 2048, bf16).
#   bash benchmarks/gpu_fmnist.sh [OUT_DIR]      (FMNIST=<folder of the IDX files> if not Debian's)
set -uo pipefail
out=${1:-runs/gpu}
spml=${SPML:-spml}
fm=(--dataset fmnist_mosaic)
[ -n "${FMNIST:-}" ] && fm+=(--data "root=$FMNIST")
python -m pytest -q -o addopts= tests/test_finetune.py tests/test_lac_method.py tests/test_lac_parts.py
time $spml train "${fm[@]}" --mode finetune --backbone efficientnet_lite0 --image-size 224 \
    --epochs 8 --batch-size 64 --lr 1e-4 --loss an --workers 12 --out "$out/ft" --quiet
time $spml train "${fm[@]}" --mode linear_init --backbone efficientnet_lite0 --image-size 224 \
    --epochs 8 --linear-epochs 25 --linear-lr 1e-3 --batch-size 64 --lr 1e-4 --loss an \
    --workers 12 --out "$out/ft" --quiet
lac=(--option views=images --option train_backbone=true --option dim=2048 --option heads=8
     --option ema_decay=0.999)
for row in "plc=false --option lac=false" "plc=true --option lac=false" "plc=true --option lac=true"; do
  # shellcheck disable=SC2086  # $row holds two --option options
  time $spml train "${fm[@]}" --mode lac "${lac[@]}" --option $row --backbone efficientnet_lite0 \
      --image-size 224 --epochs 6 --batch-size 32 --lr 1e-4 --loss an --workers 12 --amp bf16 \
      --out "$out/lac" --quiet
done
