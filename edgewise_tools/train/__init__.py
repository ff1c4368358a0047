"""YOLOv5 trainer (the ``train`` extra: imports torch). Model: ``edgewise_tools.models.yolov5``.

``python -m edgewise_tools.train --data DIR --val DIR --arch yolov5n --imgsz 256 --epochs 10 --out runs/x``
(or ``edgewise train ...``). Public API: :class:`TrainConfig`, :func:`train`,
:func:`load_checkpoint`, :class:`ComputeLoss`, :func:`bbox_iou`.
"""

from __future__ import annotations

from edgewise_tools.train.loss import ComputeLoss, LossGains, bbox_iou, scaled_gains
from edgewise_tools.train.trainer import (
           ModelEMA,
           TrainConfig,
           load_checkpoint,
           train,
           validate_model,
)

__all__ = ["ComputeLoss", "LossGains", "ModelEMA", "TrainConfig", "bbox_iou", "load_checkpoint",
           "scaled_gains", "train", "validate_model"]
