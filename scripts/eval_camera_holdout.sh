#!/usr/bin/env bash
# A second look at the camera pair on data no setting was ever judged on: `cam-holdout`
# (scripts/camera_data.sh: seed 25, 90 streams x 30 frames, the test split's held-out
# handwriting and backgrounds), three times the streams of `cam-test`, so the stream
# bootstrap's intervals are about 1.7 times narrower. The shipped camera policy, its payload
# (regions) beside whole frames, answers carried, our combined hardness against the
# baselines at equal rates -> $MODELS/eval-holdout/ (eval.json, eval.md, eval.png).
# No learned policy (its fit is scripts/eval_camera.sh's). About 46 min on 2 cores with the
# split present (generating it: about 3.5 min).
# Usage: scripts/eval_camera_holdout.sh [RUN_DIR]   (default runs/camera); env POLICY, MODELS, PY, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/camera}
PY=${PY:-.venv/bin/python}
MODELS=${MODELS:-models}
POLICY=${POLICY:-examples/policy.yaml}
THREADS=${THREADS:-2}
export OMP_WAIT_POLICY=PASSIVE
PY="$PY" scripts/camera_data.sh "$RUN" cam-holdout
"$PY" -m edgewise.cli eval --edge "$MODELS/edge-int8.onnx" --cloud "$MODELS/cloud.onnx" --policy "$POLICY" \
    --data "$RUN/data/cam-holdout" --payloads full,regions --ours combined --out "$MODELS/eval-holdout" \
    --threads "$THREADS" 2>&1 | tee "$RUN/eval-holdout.log"
