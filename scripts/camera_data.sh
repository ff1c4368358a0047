#!/usr/bin/env bash
# The camera pair's data splits, defined once (scripts/train_camera.sh and scripts/eval_camera.sh
# both call this). Every split comes from fixed seeds, so a lost run directory regenerates
# byte-identical data; a split whose dataset.json exists is skipped.
#   cam-train   seed 21, 200 streams x 20 frames, stride 3: 4000 frames for both detectors
#   cam-val     seed 22, 300 frames: best epoch, INT8 agreement
#   cam-test    seed 23, 30 x 30 = 900 frames, the headline (eval, model card); held out:
#               handwriting, backgrounds and seeds no other split uses
#   cam-policy  seed 24, 1200 frames: fits the learned policy only
#   cam-holdout seed 25, 90 x 30 = 2700 frames: a second, larger held-out split on which no
#               setting was ever chosen (scripts/eval_camera.sh RUN holdout); not in the default set
#   cam-dev     seed 26, 120 x 30 = 3600 frames: the development set a candidate policy is judged on
#               before either held-out split is spent on it (docs/design/escalation.md, "The
#               development set"); the val pool's handwriting and backgrounds, as cam-policy; not in the default set
#   tune-test   the episodes test split of scripts/train_reference.sh (the previous headline)
#   cam-train-crops / cam-val-crops: native-scale 320x320 crops for the cloud model
# Usage: scripts/camera_data.sh RUN_DIR [SPLIT...]   (no SPLIT: all of them)
#   env SCALE (divides every split's stream count: a smoke test uses SCALE=40; a split already in
#   RUN_DIR with another stream count is refused, not taken for this one), PY.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: scripts/camera_data.sh RUN_DIR [SPLIT...]}
shift
PY=${PY:-.venv/bin/python}
SCALE=${SCALE:-1}
mkdir -p "$RUN/data"

gen() {  # SPLIT_DIR SPLIT SEED STREAMS FRAMES STRIDE PRESET [extra args]
    local streams=$(( ($4 + SCALE - 1) / SCALE )) have
    if [ -f "$RUN/data/$1/dataset.json" ]; then
        # kept only when it is the split this run asks for: a smoke test's (SCALE=40) in the same
        # RUN_DIR would otherwise stand in for the full split, and what trains on it be skipped too
        have=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("streams"))' \
            "$RUN/data/$1/dataset.json")
        if [ "$have" != "$streams" ]; then
            echo "scripts/camera_data.sh: $RUN/data/$1 holds $have streams, but SCALE=$SCALE asks for $streams:" \
                "it was made by a run with another SCALE; use another RUN_DIR, or remove $RUN (its splits" \
                "and what was trained on them)" >&2
            exit 2
        fi
        return 0
    fi
    "$PY" -m edgewise.cli synth --out "$RUN/data/$1" --overwrite --split "$2" \
        --seed "$3" --streams "$streams" --frames "$5" --stride "$6" --difficulty "$7" "${@:8}" \
        > "$RUN/gen-$1.log" 2>&1
}
crops() {  # OUT FROM PER_FRAME
    [ -f "$RUN/data/$1/dataset.json" ] || "$PY" -m edgewise_tools.train.crops --data "$RUN/data/$2" \
        --out "$RUN/data/$1" --overwrite --size 320 --per-frame "$3" --seed 0 > "$RUN/gen-$1.log" 2>&1
}
split() {  # NAME: generate it (and what it is cut from)
    case "$1" in
        cam-train) gen cam-train train 21 200 20 3 camera ;;
        cam-val) gen cam-val val 22 20 15 2 camera ;;
        cam-test) gen cam-test test 23 30 30 1 camera ;;
        cam-policy) gen cam-policy val 24 40 30 1 camera ;;
        cam-holdout) gen cam-holdout test 25 90 30 1 camera ;;
        cam-dev) gen cam-dev val 26 120 30 1 camera ;;
        tune-test) gen tune-test test 13 24 50 1 episodes --imgsz 224 ;;
        cam-train-crops) split cam-train; crops cam-train-crops cam-train 2 ;;
        cam-val-crops) split cam-val; crops cam-val-crops cam-val 1 ;;
        *) echo "scripts/camera_data.sh: unknown split '$1' (known: cam-train cam-val cam-test" \
               "cam-policy cam-holdout cam-dev tune-test cam-train-crops cam-val-crops)" >&2; exit 2 ;;
    esac
}
[ $# -gt 0 ] || set -- cam-train cam-val cam-test cam-policy tune-test cam-train-crops cam-val-crops
for s in "$@"; do split "$s"; done
