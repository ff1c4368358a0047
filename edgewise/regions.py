"""Region payloads: which parts of a frame to send at full resolution, packed into one image.

DDS (Du et al., "Server-Driven Video Streaming for Deep Learning Inference", SIGCOMM 2020)
sends a low-quality stream and lets the server ask again for the *regions* it is unsure
about at high quality; the saving comes from sending most pixels once, coarsely, and few
pixels twice, finely. Here the edge knows its own doubts, so it proposes the regions itself
(docs/design/escalation.md#region-payloads):

* around each **uncertain box** (score inside the policy's band), and
* around each **motion blob no detection explains** (:mod:`edgewise.hardness.motion`): far
  objects the edge cannot resolve after its downscale still change pixels;

each padded by ``padding`` x its size and grown to at least ``min_side`` pixels (the cloud
model needs context), overlapping ones merged into their bounding box until none overlap,
the most uncertain first and at most ``max_regions``. When they would cover more than
``max_area`` of the frame, or there is none, the whole frame is sent instead (a missed
object can be anywhere).

The regions travel in **one image**: a mosaic of the full-resolution crops separated by
gutters of the letterbox grey, optionally next to the whole frame downscaled
(``low+regions``). Each :class:`Tile` says where a crop sits in the mosaic, where it came
from in the frame and at what scale, so the receiver maps every box back into frame pixels
(:func:`tiles_to_frame`). One image per escalation keeps one request per frame: the
idempotency key, the spool and the gateway's routing stay what they are for a whole frame.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from edgewise.detections import Detections

#: An uncertainty band (low, high): scalars, or one bound per box
#: (:func:`edgewise.hardness.signals.score_bands`, which applies per-class bands).
Band = Tuple[Union[float, np.ndarray], Union[float, np.ndarray]]

#: gutter between tiles (pixels) and its colour: the letterbox padding grey, which the
#: models see around every letterboxed image and do not fire on
GUTTER = 16
GUTTER_VALUE = 114

Rect = Tuple[int, int, int, int]

#: most tiles one packed image may carry (the worker refuses more, ``edgewise.wire``): a
#: ``low+regions`` payload's low frame takes one of them, so it packs at most one region fewer
MAX_TILES = 64


@dataclass(frozen=True)
class Tile:
    """One crop inside a packed image.

    ``(x, y, width, height)`` is its place in the packed image, ``(source_x, source_y)`` the
    frame pixel its top-left corner shows, and ``scale`` frame pixels per packed pixel (1 for
    a full-resolution region, e.g. 2 for the frame downscaled to half its width).
    """

    x: int
    y: int
    width: int
    height: int
    source_x: int
    source_y: int
    scale: float = 1.0

    @property
    def source_rect(self) -> Tuple[float, float, float, float]:
        """The frame pixels this tile shows (x1, y1, x2, y2)."""
        return (float(self.source_x), float(self.source_y), self.source_x + self.width * self.scale,
                self.source_y + self.height * self.scale)


def _pad(box: np.ndarray, padding: float, min_side: int, size: Tuple[int, int]) -> Rect:
    w, h = size
    x1, y1, x2, y2 = (float(v) for v in box)
    bw, bh = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
    x1, x2 = x1 - padding * bw, x2 + padding * bw
    y1, y2 = y1 - padding * bh, y2 + padding * bh
    side_w, side_h = min(max(x2 - x1, min_side), w), min(max(y2 - y1, min_side), h)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    x1 = min(max(cx - side_w / 2, 0.0), w - side_w)
    y1 = min(max(cy - side_h / 2, 0.0), h - side_h)
    return (int(np.floor(x1)), int(np.floor(y1)), int(min(w, np.ceil(x1 + side_w))), int(min(h, np.ceil(y1 + side_h))))


def overlap(a: Rect, b: Rect) -> bool:
    """Whether two rectangles ``(x1, y1, x2, y2)`` share any pixel."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def crop_region(dets: Detections, size: Tuple[int, int], band: Band, padding: float
                ) -> Optional[Rect]:
    """One crop holding every uncertain box (score in ``band``), each padded by ``padding`` x
    its size (payload mode ``crops``); None when no box is uncertain (then the full frame is
    sent: a missed object can be anywhere)."""
    if len(dets) == 0:
        return None
    mask = dets.scored_within(*band)
    if not mask.any():
        return None
    b = dets.boxes[mask].astype(np.float64)
    bw = b[:, 2] - b[:, 0]
    bh = b[:, 3] - b[:, 1]
    w, h = size
    ix1, iy1 = max(0, int(np.floor(np.min(b[:, 0] - padding * bw)))), max(0, int(np.floor(np.min(b[:, 1] - padding * bh))))
    ix2, iy2 = min(w, int(np.ceil(np.max(b[:, 2] + padding * bw)))), min(h, int(np.ceil(np.max(b[:, 3] + padding * bh))))
    if ix2 - ix1 < 2 or iy2 - iy1 < 2:
        return None
    return ix1, iy1, ix2, iy2


def merge_rects(rects: Sequence[Rect]) -> List[Rect]:
    """Replace overlapping rectangles by their bounding box until none overlap; the order
    (priority) of the first member of each group is kept."""
    out = list(rects)
    changed = True
    while changed:
        changed = False
        for i in range(len(out)):
            for j in range(i + 1, len(out)):
                a, b = out[i], out[j]
                if overlap(a, b):
                    out[i] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    del out[j]
                    changed = True
                    break
            if changed:
                break
    return out


def propose_regions(dets: Detections, motion_blobs: Optional[np.ndarray], size: Tuple[int, int],
                    band: Band, padding: float = 0.2, min_side: int = 96, max_regions: int = 8,
                    max_area: float = 0.4) -> Optional[List[Rect]]:
    """Regions (x1, y1, x2, y2) of frame ``size`` (width, height) to send at full resolution,
    most uncertain first; None = send the whole frame (see the module docstring)."""
    w, h = size
    cands: List[Rect] = []
    if len(dets):
        unc = np.nonzero(dets.scored_within(*band))[0]
        mid = np.broadcast_to((np.asarray(band[0], np.float64) + np.asarray(band[1], np.float64)) / 2.0,
                              (len(dets),))
        off = np.abs(dets.scores.astype(np.float64) - mid)
        for i in unc[np.argsort(off[unc], kind="stable")]:  # closest to its band's middle first
            cands.append(_pad(dets.boxes[i], padding, min_side, size))
    if motion_blobs is not None and len(motion_blobs):
        b = np.asarray(motion_blobs, np.float64).reshape(-1, 4)
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        for i in np.argsort(area, kind="stable"):  # small first: far objects are small
            cands.append(_pad(b[i], padding, min_side, size))
    if not cands:
        return None
    merged = merge_rects(cands)[:max_regions]
    covered = sum((r[2] - r[0]) * (r[3] - r[1]) for r in merged)
    if covered > max_area * w * h:
        return None
    return merged


def pack(frame: np.ndarray, regions: Sequence[Rect], low_width: int = 0) -> Tuple[np.ndarray, List[Tile]]:
    """One image holding ``regions`` of ``frame`` at full resolution (shelf packing, rows as
    wide as the frame, ``GUTTER`` px between tiles), preceded by the whole frame scaled to
    ``low_width`` px wide when that is > 0. Returns the image and its tiles."""
    h, w = frame.shape[:2]
    items: List[Tuple[np.ndarray, int, int, float]] = []  # pixels, source x, source y, scale
    if low_width > 0:
        lw = min(int(low_width), w)
        lh = max(1, int(round(h * lw / w)))
        low = frame if lw == w else cv2.resize(frame, (lw, lh), interpolation=cv2.INTER_AREA)
        items.append((low, 0, 0, w / lw))
    order = sorted(range(len(regions)), key=lambda i: -(regions[i][3] - regions[i][1]))
    for i in order:
        x1, y1, x2, y2 = regions[i]
        items.append((frame[y1:y2, x1:x2], x1, y1, 1.0))
    row_w = max([w] + [it[0].shape[1] for it in items])
    placed: List[Tuple[int, int]] = []
    x = y = row_h = 0
    for pixels, _, _, _ in items:
        ih, iw = pixels.shape[:2]
        if x and x + iw > row_w:
            x, y, row_h = 0, y + row_h + GUTTER, 0
        placed.append((x, y))
        x += iw + GUTTER
        row_h = max(row_h, ih)
    out_w = max(px + it[0].shape[1] for (px, _), it in zip(placed, items))
    out_h = max(py + it[0].shape[0] for (_, py), it in zip(placed, items))
    canvas = np.full((out_h, out_w) + frame.shape[2:], GUTTER_VALUE, frame.dtype)
    tiles = []
    for (px, py), (pix, sx, sy, sc) in zip(placed, items):
        ih, iw = pix.shape[:2]
        canvas[py:py + ih, px:px + iw] = pix
        tiles.append(Tile(px, py, iw, ih, sx, sy, sc))
    return canvas, tiles


def tiles_to_frame(d: Detections, tiles: Sequence[Tile], frame_size: Optional[Tuple[int, int]] = None
                   ) -> Detections:
    """Boxes found on a packed image, mapped into frame pixels: each box belongs to the tile
    holding its centre (a box in a gutter belongs to none and is dropped) and is clipped to
    that tile. Where tiles show the same frame pixels at different scales (the downscaled
    frame and a region), the finer tile's boxes win: a coarse box centred inside a finer
    tile's area is dropped."""
    if len(d) == 0 or not tiles:
        return d
    b = d.boxes.astype(np.float64)
    cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
    owner = np.full(len(d), -1)
    for k, t in enumerate(tiles):
        inside = (cx >= t.x) & (cx < t.x + t.width) & (cy >= t.y) & (cy < t.y + t.height) & (owner < 0)
        owner[inside] = k
    out = np.zeros_like(b)
    keep = owner >= 0
    for k, t in enumerate(tiles):
        m = owner == k
        if not m.any():
            continue
        bx = np.clip(b[m], [t.x, t.y, t.x, t.y], [t.x + t.width, t.y + t.height] * 2)
        out[m, 0::2] = (bx[:, 0::2] - t.x) * t.scale + t.source_x
        out[m, 1::2] = (bx[:, 1::2] - t.y) * t.scale + t.source_y
    fx, fy = (out[:, 0] + out[:, 2]) / 2, (out[:, 1] + out[:, 3]) / 2
    scales = np.array([tiles[o].scale if o >= 0 else np.inf for o in owner])
    for t in tiles:
        coarse = keep & (scales > t.scale)
        if coarse.any():
            x1, y1, x2, y2 = t.source_rect
            keep &= ~(coarse & (fx >= x1) & (fx < x2) & (fy >= y1) & (fy < y2))
    if frame_size is not None:
        np.clip(out[:, 0::2], 0, frame_size[0], out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, frame_size[1], out=out[:, 1::2])
    return dataclasses.replace(d, boxes=out.astype(np.float32)).select(keep)


def source_rects(tiles: Sequence[Tile]) -> Optional[np.ndarray]:
    """[k,4] frame rectangles the cloud saw, for the merge's ``regions`` (edge boxes outside
    them were never seen and are kept); None when a tile shows the whole frame scaled down
    (then the cloud saw everything)."""
    if not tiles or any(t.scale != 1.0 for t in tiles):
        return None
    return np.array([t.source_rect for t in tiles], np.float32).reshape(-1, 4)


#: payload modes (the policy's ``spec.payload.mode``)
MODES = ("full", "crops", "downscaled", "regions", "low+regions")
#: the modes whose answer covers only some regions of the frame (``PayloadPlan.regions`` set,
#: unless the plan fell back to the whole frame); the others show the cloud all of it
REGION_MODES = ("crops", "regions")
#: the modes ``edgewise eval`` measures side by side unless told otherwise (``crops``, the
#: older one-crop mode, on request)
COMPARED_MODES = ("full", "downscaled", "regions", "low+regions")


def regions_most(mode: str, max_regions: int) -> int:
    """The most regions a ``mode`` payload packs under ``maxRegions``: one image holds at most
    :data:`MAX_TILES` parts, and ``low+regions``'s downscaled frame is one of them."""
    return min(max_regions, MAX_TILES - (1 if mode == "low+regions" else 0))


def low_is_frame(width: int, low_width: int) -> bool:
    """Whether a frame ``width`` pixels wide, scaled to ``low_width`` (never enlarged), is the
    frame itself: then ``downscaled`` and ``low+regions`` send the whole frame (as ``full``), for
    a region next to it would be the same pixels twice (each object found twice at the same
    scale, so no tile wins in :func:`tiles_to_frame`)."""
    return low_width >= width


@dataclass
class PayloadPlan:
    """What one escalation sends, before encoding.

    Attributes:
        image: the pixels to encode and send.
        tiles: where each part of ``image`` comes from (empty: ``image`` is the frame, or a
            crop of it at ``offset``, at full resolution).
        regions: the frame rectangles the cloud sees, for the merge (edge boxes outside them
            are kept as they are); None when it sees the whole frame.
        offset: the top-left frame pixel of a single crop (mode ``crops``).
    """

    image: np.ndarray
    tiles: List[Tile]
    regions: Optional[np.ndarray] = None
    offset: Tuple[int, int] = (0, 0)


def plan_payload(frame: np.ndarray, dets: Detections, motion_blobs: Optional[np.ndarray], mode: str,
                 band: Band, padding: float = 0.2, min_side: int = 96, max_regions: int = 8,
                 max_area: float = 0.4, low_width: int = 640) -> PayloadPlan:
    """The payload of one escalation in ``mode`` (:data:`MODES`, the policy's ``spec.payload``):

    * ``full``: the frame; ``crops``: one crop around the uncertain boxes (else the frame);
    * ``downscaled``: the frame scaled to ``low_width`` pixels wide (one tile);
    * ``regions``: the proposed regions (:func:`propose_regions`) packed at full resolution,
      else the frame;
    * ``low+regions``: the frame scaled to ``low_width`` plus the regions, else just the
      scaled frame (DDS's low-quality stream is always sent).

    A frame no wider than ``low_width`` goes whole in ``downscaled`` and ``low+regions``: it is
    never enlarged, so its "low" frame is the frame at full resolution.
    """
    if mode not in MODES:
        raise ValueError(f"payload mode must be one of {MODES}, got {mode!r}")
    h, w = frame.shape[:2]
    if mode == "crops":
        r = crop_region(dets, (w, h), band, padding)
        if r is None:
            return PayloadPlan(frame, [])
        x1, y1, x2, y2 = r
        return PayloadPlan(np.ascontiguousarray(frame[y1:y2, x1:x2]), [], np.array([r], np.float32), (x1, y1))
    if mode in ("downscaled", "low+regions") and low_is_frame(w, low_width):
        return PayloadPlan(frame, [])
    if mode == "downscaled":
        img, tiles = pack(frame, [], low_width)
        return PayloadPlan(img, tiles)
    if mode in ("regions", "low+regions"):
        low = low_width if mode == "low+regions" else 0
        rs = propose_regions(dets, motion_blobs, (w, h), band, padding, min_side, regions_most(mode, max_regions),
                             max_area)
        if rs is None:
            return PayloadPlan(frame, []) if not low else PayloadPlan(*pack(frame, [], low))
        img, tiles = pack(frame, rs, low)
        return PayloadPlan(img, tiles, source_rects(tiles))
    return PayloadPlan(frame, [])
