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
#   2. edge: yolov5n on whole frames, trained in resolution steps (progressive resizing):
#      EDGE_SIZES (320 416) with EDGE_BUDGETS (1800 1200 s), stage RUN/edge-<size>, the first
#      fine-tuned from $PREVIOUS/edge.onnx, each next one from the one before. At 416 a 1280x720
#      frame is downscaled 3.1x (far digits of 16-28 px become 5-9 px); at 320 the edge also
#      missed most near digits (recall 0.36 against the cloud's 0.82 on the test split)
#   3. cloud: yolov5s on the native-scale crops (far digits keep their 16-28 px), fine-tuned
#      from $PREVIOUS/cloud.onnx; at run time it sees whole frames or regions natively
#   4. package: the last edge stage exported at the frame's aspect (256x416) + INT8, cloud with a symbolic
#      height/width, each with its score threshold chosen on the validation split, all scored on
#      the camera test split (recall by object size) and the episodes test split ->
#      $MODELS/metrics.json (python -m edgewise_tools.train.camera)
# The two detectors train one after the other, each on both cores (THREADS=2): nothing else
# heavy should run on the machine meanwhile. Measured on 2 cores (models/camera/): data 12 min,
# edge 1800 + 1200 s, cloud CLOUD_BUDGET (3000 s), packaging 8 min: 2 h in all.
# Usage: scripts/train_camera.sh [RUN_DIR]   (default runs/camera)
#   A stage whose output exists is skipped, and a detector interrupted mid-training continues
#   from its last finished epoch (RUN/edge-<size>|cloud/resume.pt), so running it again resumes.
#   env EDGE_SIZES / EDGE_BUDGETS (one wall-clock budget in seconds per edge size), CLOUD_BUDGET
#   (0 = no limit: EPOCHS epochs of EPOCH_SIZE images), EPOCHS, EPOCH_SIZE, THREADS, DEVICE (cpu | cuda | auto),
#   MODELS (where the pair goes, default models), PREVIOUS (the pair it starts from, default
#   MODELS; `MODELS=models/camera PREVIOUS=models` stages the pair next to the shipped one, as
#   models/camera/ was made), EDGE_INIT / CLOUD_INIT (ONNX to start from: the first edge step, the cloud),
#   SCALE (divides every split's stream count: a smoke test uses SCALE=40), PY.
#   The mission's own pair on a GPU (YOLOv5s edge at 640, YOLOv5x cloud on whole frames at
#   1280; docs/models.md "On a GPU"): DEVICE=cuda EDGE_ARCH=yolov5s EDGE_SIZES=640
#   CLOUD_ARCH=yolov5x CLOUD_DATA=frames CLOUD_IMGSZ=1280 EDGE_INIT=none CLOUD_INIT=none (the
#   shipped pair is yolov5n/yolov5s: its weights do not fit these architectures); BATCH;
#   PACKAGE=0 stops after training (no ONNX scoring on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/camera}
PY=${PY:-.venv/bin/python}
MODELS=${MODELS:-models}
EDGE_SIZES=${EDGE_SIZES:-320 416}
EDGE_BUDGETS=${EDGE_BUDGETS:-1800 1200}
CLOUD_BUDGET=${CLOUD_BUDGET:-3000}
EPOCHS=${EPOCHS:-500}
EPOCH_SIZE=${EPOCH_SIZE:-2000}
THREADS=${THREADS:-2}
DEVICE=${DEVICE:-cpu}
SCALE=${SCALE:-1}
EDGE_ARCH=${EDGE_ARCH:-yolov5n}
CLOUD_ARCH=${CLOUD_ARCH:-yolov5s}
CLOUD_DATA=${CLOUD_DATA:-crops}   # crops: native-scale 320x320 crops; frames: whole frames at CLOUD_IMGSZ
CLOUD_IMGSZ=${CLOUD_IMGSZ:-320}
BATCH=${BATCH:-8}
PACKAGE=${PACKAGE:-1}
case "$PACKAGE" in
    0|1) ;;
    *) echo "scripts/train_camera.sh: PACKAGE must be 1 (package and score) or 0 (stop after training), not '$PACKAGE'" >&2; exit 2 ;;
esac
case "$CLOUD_DATA" in
    crops) CLOUD_TRAIN=cam-train-crops; CLOUD_VAL=cam-val-crops ;;
    frames) CLOUD_TRAIN=cam-train; CLOUD_VAL=cam-val ;;
    *) echo "scripts/train_camera.sh: CLOUD_DATA must be crops or frames, not '$CLOUD_DATA'" >&2; exit 2 ;;
esac
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

# 1. data (scripts/camera_data.sh: the splits and their seeds); without packaging, only what trains
if [ "$PACKAGE" = 1 ]; then
    PY="$PY" SCALE="$SCALE" scripts/camera_data.sh "$RUN"
else
    PY="$PY" SCALE="$SCALE" scripts/camera_data.sh "$RUN" cam-train cam-val "$CLOUD_TRAIN" "$CLOUD_VAL"
fi

# 2./3. detectors, one after the other on all cores
detector() {  # OUT ARCH TRAIN VAL BUDGET INIT IMGSZ   (INIT none: from scratch)
    local from=()
    [ "$6" = none ] || from=(--init "$6")
    [ -f "$RUN/$1/summary.json" ] || nice -n 5 "$PY" -m edgewise_tools.train --data "$RUN/data/$3" \
        --val "$RUN/data/$4" --val-limit 300 --batch "$BATCH" --nbs "$BATCH" --optimizer AdamW --lr0 0.0005 \
        --warmup-epochs 0.05 --epochs "$EPOCHS" --epoch-size "$EPOCH_SIZE" --seed 0 --device "$DEVICE" \
        --arch "$2" --imgsz "$7" --threads "$THREADS" --time-budget "$5" "${from[@]}" --out "$RUN/$1" --resume \
        >> "$RUN/$1.log" 2>&1
}
read -r -a sizes <<< "$EDGE_SIZES"
read -r -a budgets <<< "$EDGE_BUDGETS"
if [ "${#sizes[@]}" -eq 0 ] || [ "${#sizes[@]}" -ne "${#budgets[@]}" ]; then
    echo "scripts/train_camera.sh: EDGE_SIZES ($EDGE_SIZES) and EDGE_BUDGETS ($EDGE_BUDGETS) need one budget per size" >&2
    exit 2
fi
init=$EDGE_INIT
for i in "${!sizes[@]}"; do
    detector "edge-${sizes[$i]}" "$EDGE_ARCH" cam-train cam-val "${budgets[$i]}" "$init" "${sizes[$i]}"
    init=$RUN/edge-${sizes[$i]}/best.onnx
done
detector cloud "$CLOUD_ARCH" "$CLOUD_TRAIN" "$CLOUD_VAL" "$CLOUD_BUDGET" "$CLOUD_INIT" "$CLOUD_IMGSZ"

# 4. package and score (the last edge step)
[ "$PACKAGE" = 1 ] || exit 0
"$PY" -m edgewise_tools.train.camera --run "$RUN" --models "$MODELS" --edge-stage "edge-${sizes[-1]}" | tee "$RUN/package.md"
