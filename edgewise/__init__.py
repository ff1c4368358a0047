"""edgewise: the runtime core that the edge daemon and the cloud tier import.

Detector runtime (ONNX Runtime / TensorRT backends, letterbox, YOLOv5 decode,
NMS), hardness signals, the escalation policy, wire codecs and the image check,
the status vocabulary, the settings mechanism, synthetic scenes and the command
dispatcher. It is the only library code shipped to a device; it imports neither
``edge``, ``cloud`` nor the offline tools in ``edgewise_tools``.
"""

from __future__ import annotations

__version__ = "0.1.0"
