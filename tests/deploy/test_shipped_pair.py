"""What ships is one pair: the Jetson bundle's edge model and policy, the cloud images' baked
model, the chart's default model path and ``make demo`` name the same camera pair and policy.
(They drifted once: the bundle and the images kept the episodes pair after the demo moved on.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from edge import bundle
from edgewise_tools.demo.running import DEMO_CLOUD_MODEL, DEMO_EDGE_MODEL, WORLDS, model_world
from edgewise_tools.images import DOCKERFILE, image_files

ROOT = Path(__file__).resolve().parents[2]


def test_bundle_images_chart_and_demo_ship_one_pair() -> None:
    # the bundle ships the TensorRT layout of the demo's INT8 model: both quantized from one edge.onnx
    from edgewise.runtime.metadata import load_model_info

    assert bundle.DEFAULT_MODEL == DEMO_EDGE_MODEL.with_name("edge-int8-trt.onnx")
    ours, demo = load_model_info(bundle.DEFAULT_MODEL), load_model_info(DEMO_EDGE_MODEL)
    assert (ours.names, ours.imgsz, ours.metadata.get("arch")) == (demo.names, demo.imgsz, demo.metadata.get("arch"))
    assert model_world(bundle.DEFAULT_MODEL) == "camera" and bundle.DEFAULT_POLICY == WORLDS["camera"].policy
    values = yaml.safe_load((ROOT / "charts" / "edgewise" / "values.yaml").read_text())
    for dockerfile in (DOCKERFILE, DOCKERFILE.with_name("Dockerfile.cuda")):
        baked = image_files(dockerfile)
        assert baked.get(values["model"]["path"]) == DEMO_CLOUD_MODEL, (dockerfile, baked)
        assert "/models/MODEL_CARD.md" in baked
    assert model_world(DEMO_EDGE_MODEL) == model_world(DEMO_CLOUD_MODEL) == "camera"
