"""The edge daemon's side of carrying the cloud's boxes between escalations.

Per stream it remembers the pixels of the frames whose escalation is on its way (the
templates are cut from the frame the cloud saw), seeds the tracker when an answer comes
back, and on every later frame the pipeline publishes the edge's boxes combined with the
carried ones (:mod:`edgewise.carrying`, the same functions ``edgewise eval`` measures;
``merge.carryEdgeFloor`` drops the edge's doubtful boxes where an answer in force looked).
A newer answer replaces an older one (under ``merge.carryScope: regions``, only inside the
regions it saw: the older answers stay carried elsewhere, :func:`edgewise.carrying.stacked`);
an answer that comes back after a newer one is in force, or from the spool's replay, is not
carried (it is older than what the edge has). A live stream's outage ends its carrying: at the first
frame after it the stream's answers and waiting pixels are let go (``forget``), so boxes from
before a camera went down are not carried onto its frames minutes later.
The frames between are stepped over in one go: the search window widens with the frames
elapsed. Pure bookkeeping on the event loop; callers: ``edge.pipeline`` (``sent``,
``in_force``, ``publish``, ``forget``) and ``edge.escalating`` (``answered``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import numpy as np

from edgewise.carrying import (
    CARRIED,
    CarryConfig,
    CarryState,
    Looked,
    combine,
    fits,
    grey,
    layered,
    seed,
    stacked,
    step,
)
from edgewise.detections import Detections

#: escalated frames per stream whose pixels are kept for their answer (the oldest go first)
MAX_WAITING = 8


def publish(dets: Detections, carried: Detections, looked: Looked, cfg: CarryConfig) -> Detections:
    """The boxes a frame that was not escalated publishes: the edge's with the carried ones
    (``looked``: where the answers in force looked, for ``cfg.edge_floor``)."""
    return combine(dets, carried, edge_floor=cfg.edge_floor, looked=looked)


class _Layer:
    """The answer to frame ``seq``: where its boxes are as of frame ``at``, and the regions
    its request covered (None: the whole frame)."""

    __slots__ = ("seq", "at", "state", "regions")

    def __init__(self, seq: int, state: CarryState, regions: Optional[np.ndarray]) -> None:
        self.seq, self.at, self.state, self.regions = seq, seq, state, regions


class Carrier:
    """Which answer each stream carries, and where its boxes are now."""

    def __init__(self) -> None:
        self._waiting: Dict[str, OrderedDict[int, np.ndarray]] = {}
        self._layers: Dict[str, List[_Layer]] = {}  # per stream, newest answer first

    def sent(self, stream: str, seq: int, image: np.ndarray, cfg: CarryConfig) -> None:
        """Frame ``seq`` of ``stream`` was escalated: keep its pixels (grey, a third of the
        bytes; the templates are grey) for the answer, when the policy carries answers."""
        if not cfg.enabled:
            return
        waiting = self._waiting.setdefault(stream, OrderedDict())
        waiting[seq] = grey(image)
        while len(waiting) > MAX_WAITING:
            waiting.popitem(last=False)

    def answered(self, stream: str, seq: int, cloud: Detections, cfg: CarryConfig,
                 regions: Optional[np.ndarray] = None) -> None:
        """The cloud's boxes for frame ``seq``, whose request covered ``regions`` (None: the
        whole frame): carry them from that frame on."""
        image = self._waiting.get(stream, OrderedDict()).pop(seq, None)
        layers = self._layers.get(stream, [])
        if image is None or not cfg.enabled or (layers and layers[0].seq >= seq):
            return
        self._layers[stream] = stacked(layers, _Layer(seq, seed(image, cloud, cfg), regions), regions, cfg)

    def in_force(self, stream: str, seq: int, image: np.ndarray, cfg: CarryConfig) -> Tuple[Detections, Looked]:
        """The boxes ``stream`` carries onto frame ``seq``, found on ``image`` (empty: none), and
        where the answers in force looked (each one's regions, None: the whole frame; empty: no
        answer in force). Called once per frame, escalated or not, so the trackers follow every
        frame. The boxes are what the policy reads before deciding (the carry state); with where
        the answers looked, they are what :func:`publish` takes for a frame not escalated
        (:meth:`apply`)."""
        layers = self._layers.get(stream)
        if not layers:
            return Detections.empty(source=CARRIED), ()
        stepped = []
        for layer in layers:
            if seq > layer.at:  # each frame once, and never back in time
                layer.state = step(layer.state, image, cfg, frames=seq - layer.at)
                layer.at = seq
                stepped.append(layer)
        # an answer with nothing left still hides the older ones in its regions until it expires
        alive = [layer for layer in layers if layer.state.age <= cfg.frames]
        if alive:
            self._layers[stream] = alive
        else:
            del self._layers[stream]
        boxes = layered([(layer.state.detections(), layer.regions) for layer in stepped if layer in alive])
        # (an answer for frames of another size looked at none of this frame's pixels)
        return boxes, tuple(layer.regions for layer in alive if fits(layer.state, image))

    def apply(self, stream: str, seq: int, image: np.ndarray, dets: Detections, cfg: CarryConfig) -> Detections:
        """Frame ``seq``'s boxes to publish: the edge's with the carried ones, found on ``image``."""
        return publish(dets, *self.in_force(stream, seq, image, cfg), cfg)

    def forget(self, stream: str) -> None:
        """``stream`` came back after an outage: the answers it carries and the pixels of its
        escalations on their way are of frames from before it, which the frames after it do
        not follow (``carryFrames`` counts frames, and frame numbers run on across an outage);
        an answer that comes back for one of them is not carried."""
        self._layers.pop(stream, None)
        self._waiting.pop(stream, None)

    def carrying(self, stream: str) -> int:
        """Boxes carried on ``stream`` now (every answer's, before the regions rule)."""
        return sum(len(layer.state) for layer in self._layers.get(stream, []))
