#!/usr/bin/env bash
# Train the camera reference pair (models/MODEL_CARD.md, "The camera pair"): a world where the
# cloud sees what the edge cannot (docs/design/escalation.md#the-camera-world).
#   0. both new models start from the previous pair (episodes world), $PREVIOUS (--init FILE.onnx:
#      fused Conv+BN weights unfused on training images, edgewise_tools.train.onnxinit); replaced
#      in place, that pair is kept under $MODELS/episodes/ (copied once, with metrics and evaluations)
#   1. data (scripts/camera_data.sh): splits of the `camera` preset at 1280x720 (fixed seeds; the
#      test and policy splits use held-out handwriting/backgrounds and seeds no other split uses),
#      native-scale 320x320 crops of the training and validation frames for the cloud model, and
#      the episodes test split of scripts/train_reference.sh (the previous headline, for continuity)
#   2. edge: yolov5n on whole frames letterboxed to 320 (a 4x downscale: far digits of 16-28 px
#      become 4-7 px), fine-tuned from $PREVIOUS/edge.onnx
#   3. cloud: yolov5s on the native-scale crops (far digits keep their 16-28 px), fine-tuned
#      from $PREVIOUS/cloud.onnx; at run time it sees whole frames or regions natively
#   4. package: edge exported at 192x320 (the frame's aspect) + INT8, cloud with a symbolic
#      height/width, all scored on the camera test split (recall by object size) and the
#      episodes test split -> $MODELS/metrics.json (python -m edgewise_tools.train.camera)
# The two detectors train one after the other, each on both cores (THREADS=2): nothing else
# heavy should run on the machine meanwhile. Measured on 2 cores (models/camera/): data 12 min,
# edge EDGE_BUDGET (1800 s), cloud CLOUD_BUDGET (3000 s), packaging 7 min: 1 h 40 min in all.
# Usage: scripts/train_camera.sh [RUN_DIR]   (default runs/camera)
#   A stage whose output exists is skipped, and a detector interrupted mid-training continues
#   from its last finished epoch (RUN/edge|cloud/resume.pt), so running it again resumes.
#   env EDGE_BUDGET / CLOUD_BUDGET: wall-clock seconds per detector (0 = no limit: EPOCHS
#   epochs of EPOCH_SIZE images), EPOCHS, EPOCH_SIZE, THREADS, DEVICE (cpu | cuda | auto),
#   MODELS (where the pair goes, default models), PREVIOUS (the pair it starts from, default
#   MODELS; `MODELS=models/camera PREVIOUS=models` stages the pair next to the shipped one, as
#   models/camera/ was made), EDGE_INIT / CLOUD_INIT (ONNX to start from),
#   SCALE (divides every split's stream count: a smoke test uses SCALE=40), PY.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/camera}
PY=${PY:-.venv/bin/python}
MODELS=${MODELS:-models}
EDGE_BUDGET=${EDGE_BUDGET:-1800}
CLOUD_BUDGET=${CLOUD_BUDGET:-3000}
EPOCHS=${EPOCHS:-500}
EPOCH_SIZE=${EPOCH_SIZE:-2000}
THREADS=${THREADS:-2}
DEVICE=${DEVICE:-cpu}
SCALE=${SCALE:-1}
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$RUN"

# 0. the pair to start from: PREVIOUS (default MODELS). Replacing it in place keeps it under
#    $MODELS/episodes/ (copied once, with its metrics and evaluations).
PREVIOUS=${PREVIOUS:-$MODELS}
if [ "$PREVIOUS" = "$MODELS" ]; then
    if [ ! -f "$MODELS/episodes/edge.onnx" ]; then
        mkdir -p "$MODELS/episodes"
        for f in edge.onnx edge-int8.onnx cloud.onnx metrics.json; do cp -p "$MODELS/$f" "$MODELS/episodes/$f"; done
        for d in eval eval-reference; do [ -d "$MODELS/$d" ] && cp -rp "$MODELS/$d" "$MODELS/episodes/$d"; done
    fi
    PREVIOUS=$MODELS/episodes
fi
EDGE_INIT=${EDGE_INIT:-$PREVIOUS/edge.onnx}
CLOUD_INIT=${CLOUD_INIT:-$PREVIOUS/cloud.onnx}

# 1. data (scripts/camera_data.sh: the splits and their seeds)
PY="$PY" SCALE="$SCALE" scripts/camera_data.sh "$RUN"

# 2./3. detectors, one after the other on all cores
detector() {  # OUT ARCH TRAIN VAL BUDGET INIT
    [ -f "$RUN/$1/summary.json" ] || nice -n 5 "$PY" -m edgewise_tools.train --data "$RUN/data/$3" \
        --val "$RUN/data/$4" --val-limit 300 --batch 8 --nbs 8 --optimizer AdamW --lr0 0.0005 \
        --warmup-epochs 0.05 --epochs "$EPOCHS" --epoch-size "$EPOCH_SIZE" --seed 0 --device "$DEVICE" \
        --arch "$2" --imgsz 320 --threads "$THREADS" --time-budget "$5" --init "$6" --out "$RUN/$1" --resume \
        >> "$RUN/$1.log" 2>&1
}
detector edge yolov5n cam-train cam-val "$EDGE_BUDGET" "$EDGE_INIT"
detector cloud yolov5s cam-train-crops cam-val-crops "$CLOUD_BUDGET" "$CLOUD_INIT"

# 4. package and score
"$PY" -m edgewise_tools.train.camera --run "$RUN" --models "$MODELS" | tee "$RUN/package.md"
