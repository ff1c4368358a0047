#!/usr/bin/env bash
# Evaluate the camera pair (README, "Camera world"; models/MODEL_CARD.md), after
# scripts/train_camera.sh packaged it into $MODELS. The splits it reads are regenerated from their
# seeds by scripts/camera_data.sh when RUN/data lacks them (about 10 min):
#   1. the headline: the held-out camera test split (900 frames, 30 streams), every payload
#      mode side by side, policies at equal rates with 95% intervals from resampled streams,
#      the learned policy fitted on cam-policy -> $MODELS/eval/ (eval.json, eval.md, eval.png,
#      gain-model.json: examples/policies/learned.yaml uses it); the policy judged against the
#      target is the one the camera policy file ships, its combined hardness (--ours combined);
#      answers are carried between escalations (the policy's merge.carryFrames, --carry-lag 1)
#   2. continuity: the same pair on the episodes test split (1200 frames of 224x224; whole
#      frames only) -> $MODELS/eval-episodes/; the previous pair's own evaluation stays in
#      $MODELS/episodes/eval/
# 29 min on 2 cores with the splits present (the cloud model runs natively on every test
# frame once per payload mode, and on the policy split once; every answer is tracked through
# its stream for carrying; the episodes split is small).
# Usage: scripts/eval_camera.sh [RUN_DIR]   (default runs/camera); env POLICY, MODELS, PY, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/camera}
PY=${PY:-.venv/bin/python}
MODELS=${MODELS:-models}
POLICY=${POLICY:-examples/policy.yaml}
THREADS=${THREADS:-2}
export OMP_WAIT_POLICY=PASSIVE
PY="$PY" scripts/camera_data.sh "$RUN" cam-test cam-policy tune-test
"$PY" -m edgewise.cli eval --edge "$MODELS/edge-int8.onnx" --cloud "$MODELS/cloud.onnx" --policy "$POLICY" \
    --data "$RUN/data/cam-test" --train-data "$RUN/data/cam-policy" --ours combined --out "$MODELS/eval" \
    --threads "$THREADS" \
    2>&1 | tee "$RUN/eval-camera.log"
"$PY" -m edgewise.cli eval --edge "$MODELS/edge-int8.onnx" --cloud "$MODELS/cloud.onnx" --policy "$POLICY" \
    --data "$RUN/data/tune-test" --payloads full --payload full --out "$MODELS/eval-episodes" \
    --threads "$THREADS" 2>&1 | tee "$RUN/eval-episodes.log"
