"""edgewise: the shared SDK of the edge daemon and the cloud tier.

Detector runtime (ONNX Runtime / TensorRT backends, letterbox, YOLOv5 decode,
NMS), hardness signals, escalation-policy schema, wire codecs and the CLI.
"""

from __future__ import annotations

__version__ = "0.1.0"
