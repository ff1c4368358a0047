"""Procedural camera streams: handwritten digits painted over real video/photos, with exact labels.

One :class:`StreamGenerator` is one camera: a background (a stretch of
``vtest.avi`` or a slowly panned photograph), clutter strokes painted on it,
a few occluders (poles, boards cut from other photographs) in front, and digit
"signs" that enter, move, grow/shrink and leave. Every draw comes from a numpy
``Generator`` seeded by ``(seed, split, stream)``, so the same arguments give
byte-identical frames and labels.

Label rules (what the tests check):

* A label's box is the pixel extent of the object's *visible* mask: its alpha
  (after scaling, rotation and motion blur) times what the layers in front of it
  leave uncovered, thresholded at ``ALPHA_THRESHOLD``; clipped to the image,
  ``x1``/``y1`` exclusive (a box of one pixel has width 1). This is COCO's rule
  (the box of the visible segmentation), so an occluded digit's box shrinks to
  the part that can be seen.
* ``visible`` = visible mask pixels / full mask pixels (frame edges count as
  occlusion). Objects with ``visible < min_visible`` are not labelled for
  training (no YOLO line) and appear in COCO as ``iscrowd=1, ignore=1`` so an
  evaluator neither rewards nor punishes detections of them.
* Sensor noise and low-light gain are applied after the labels are fixed: they
  change how hard an object is to see, not where it is.

With ``Difficulty.horizon`` > 0 (the ``camera`` preset) the camera is fixed and looks
over a ground plane: a digit's apparent height is its physical height times its
depth factor ``k = (y - horizon) / (height - horizon)`` (a pinhole camera over flat
ground), its image speed is its ground speed times ``k`` sideways and ``k**2`` in
depth, so far digits are small, sit just below the horizon and move slowly. This
geometry draws from the random streams only in that mode: every other preset
renders the same bytes as before it existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import cv2
import numpy as np

from edgewise.synth.assets import SPLITS, load_photos, load_sprites, load_video
from edgewise.synth.settings import Difficulty

ALPHA_THRESHOLD = 0.5
#: the largest seed (``edgewise synth --seed``): 64 bits
MAX_SEED = 2**64 - 1
CLASS_NAMES: Tuple[str, ...] = tuple(str(i) for i in range(10))
LOOKALIKES: Tuple[Tuple[int, int], ...] = ((1, 7), (3, 8), (4, 9), (5, 6))
_LUMA = np.array([0.114, 0.587, 0.299], dtype=np.float32)  # BGR
#: ground-plane mode decodes the background video at this width (see _init_camera_background)
_CAMERA_VIDEO_WIDTH = 640
#: the widest decode of the background video in the flat presets' mode: frames up to 640x480
#: decode at 1.6x their width as before (byte-identical), larger ones at this width (the clip
#: itself is 768 px wide), so memory does not grow with the square of the frame size
_FLAT_VIDEO_MAX_WIDTH = 1024


@dataclass
class ObjectLabel:
    """Ground truth of one digit in one frame (pixels of the output frame)."""

    track_id: int
    class_id: int
    box: Tuple[int, int, int, int]  # x0, y0, x1, y1; x1/y1 exclusive
    visible: float  # visible mask fraction in [0, 1]
    labelled: bool  # visible >= min_visible and a non-empty box
    size_px: float  # rendered digit height (unoccluded)
    contrast: float  # ink/background luminance difference, fraction of 255
    hardness: float  # the object's hardness draw in [0, 1]
    lookalike: bool  # drawn from a look-alike pair


@dataclass
class _Obj:
    track_id: int
    class_id: int
    sprite: np.ndarray
    x: float
    y: float
    vx: float
    vy: float
    size: float
    scale_rate: float
    angle: float
    contrast: float
    hue: np.ndarray
    sign: float
    hardness: float
    lookalike: bool
    ttl: int
    episodic: bool = False  # part of a hard episode (not counted towards the stream's target)
    # ground-plane mode only: physical height (apparent height at the bottom edge of the
    # frame) and ground velocity (px/frame at the bottom edge)
    phys: float = 0.0
    gvx: float = 0.0
    gvy: float = 0.0


@dataclass
class _Occluder:
    x: float
    y: float
    vx: float
    w: int
    h: int
    texture: np.ndarray  # h x w x 3 float32
    alpha: np.ndarray  # h x w float32


@dataclass
class _Layer:
    x0: int
    y0: int
    alpha: np.ndarray  # clipped to the frame
    color: np.ndarray  # (3,) or (h, w, 3) float32
    obj: Optional[_Obj] = None
    full_count: int = 0


@dataclass
class StreamState:
    frame_index: int = 0
    hardness: float = 0.5
    low_light: bool = False
    gain: float = 1.0
    episode_left: int = 0  # frames left in the current hard episode (0: none)
    extra: List[str] = field(default_factory=list)


def _tight(sprite: np.ndarray) -> Tuple[int, int, int, int]:
    ys, xs = np.nonzero(sprite > 0.1)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def _lerp(a: float, b: float, t: float) -> float:
    return a + (b - a) * t


class StreamGenerator:
    """One synthetic camera stream; call :meth:`next_frame` repeatedly.

    Raises ConfigError when a ``width`` x ``height`` frame cannot hold the tallest digit
    ``difficulty`` draws (:meth:`Difficulty.check_frame`).
    """

    def __init__(self, width: int, height: int, difficulty: Difficulty, split: str,
                 seed: int, stream: int,
                 flat_background: Optional[Tuple[int, int, int]] = None) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}")
        if not 0 <= int(seed) <= MAX_SEED:
            raise ValueError(f"seed {seed}: must be 0..{MAX_SEED}")
        self.w, self.h = int(width), int(height)
        difficulty.check_frame(self.w, self.h)  # every digit must fit in the frame (ConfigError)
        self.d = difficulty
        self.split = split
        # the whole seed: one above 2**32 is its own scene (seeds below keep their bytes)
        ss = np.random.SeedSequence([int(seed), SPLITS.index(split), int(stream)])
        # occluders and hard episodes draw from their own streams, so a scene with and
        # without them is the same scene
        ss_main, ss_occ, ss_ep = ss.spawn(3)
        self.rng = np.random.default_rng(ss_main)
        self.occ_rng = np.random.default_rng(ss_occ)
        self.ep_rng = np.random.default_rng(ss_ep)
        self.flat = flat_background
        self.sprites = load_sprites(split)
        self.state = StreamState()
        self._next_track = 0
        self.objects: List[_Obj] = []
        rng, d = self.rng, difficulty
        lo = max(0.0, d.hardness_mean - d.hardness_spread)
        hi = min(1.0, d.hardness_mean + d.hardness_spread)
        self.state.hardness = float(rng.uniform(lo, hi))
        self._h_lo, self._h_hi = lo, hi
        self.state.low_light = bool(rng.random() < d.low_light_prob)
        self.state.gain = float(rng.uniform(*d.low_light_gain)) if self.state.low_light else 1.0
        self.target_objects = int(rng.integers(d.objects_min, d.objects_max + 1))
        self._init_background()
        self._init_occluders()
        for _ in range(self.target_objects):
            self.objects.append(self._spawn(anywhere=True))

    # ---------------------------------------------------------------- background
    def _init_background(self) -> None:
        rng, w, h = self.rng, self.w, self.h
        self.video: Optional[List[np.ndarray]] = None
        if self.d.horizon > 0:
            self._init_camera_background()
            return
        side = max(w, h)
        if rng.random() < 0.5:
            # one cached decode per frame size; each stream crops its own window (zoom z).
            # Past _FLAT_VIDEO_MAX_WIDTH the clip is decoded at that width and each window
            # scaled up (a 4096 px frame held 125-560 decodes of 96 MB each).
            vw = min(int(round(max(w, h * 4 / 3) * 1.6)), _FLAT_VIDEO_MAX_WIDTH)
            frames = load_video(self.split, vw)
            self.video = frames
            self.vpos = int(rng.integers(0, len(frames)))
            self.vdir = 1
            fh, fw = frames[0].shape[:2]
            fit = min(fw / w, fh / h)
            z = float(rng.uniform(1.0, fit)) if fit >= 1.0 else float(rng.uniform(0.6, 1.0)) * fit
            self.vwin = (max(1, int(w * z)), max(1, int(h * z)))
            self.cx = float(rng.uniform(0, fw - self.vwin[0]))
            self.cy = float(rng.uniform(0, fh - self.vwin[1]))
            self.pan = (0.0, 0.0)
            self.photo = frames[0]
        else:
            photos = load_photos(self.split, int(side * 1.3))
            photo = photos[int(rng.integers(0, len(photos)))]
            s = rng.uniform(1.1, 2.0) * side / min(photo.shape[:2])
            photo = cv2.resize(photo, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
            self.photo = photo
            fh, fw = photo.shape[:2]
            self.cx = float(rng.uniform(0, fw - w))
            self.cy = float(rng.uniform(0, fh - h))
            sp = rng.uniform(0, 0.6)
            a = rng.uniform(0, 2 * math.pi)
            self.pan = (sp * math.cos(a), sp * math.sin(a))
        # clutter strokes painted on the scene (in background coordinates)
        n = int(rng.integers(0, self.d.clutter_max + 1))
        self.clutter = []
        for _ in range(n):
            self.clutter.append(self._make_stroke())

    def _init_camera_background(self) -> None:
        """A fixed camera's view: a still window of the video (pedestrians walk through it)
        or of a photograph, scaled to the frame. The video is decoded at a modest width and
        each frame's window scaled up, so camera-resolution frames do not hold the whole
        clip at several thousand pixels in memory."""
        rng, w, h = self.rng, self.w, self.h
        if rng.random() < 0.5:
            frames = load_video(self.split, _CAMERA_VIDEO_WIDTH)
            self.video = frames
            self.vpos = int(rng.integers(0, len(frames)))
            self.vdir = 1
            fh, fw = frames[0].shape[:2]
            z = float(rng.uniform(0.6, 1.0)) * min(fw / w, fh / h)  # window of the frame's aspect
            self.vwin = (max(1, int(w * z)), max(1, int(h * z)))
            self.cx = float(rng.uniform(0, fw - self.vwin[0]))
            self.cy = float(rng.uniform(0, fh - self.vwin[1]))
            self.photo = frames[0]
        else:
            photos = load_photos(self.split, int(min(w, h) * 1.05))
            photo = photos[int(rng.integers(0, len(photos)))]
            s = float(rng.uniform(1.0, 1.4)) * max(w / photo.shape[1], h / photo.shape[0])
            self.photo = cv2.resize(photo, None, fx=s, fy=s, interpolation=cv2.INTER_AREA if s < 1 else
                                    cv2.INTER_LINEAR)
            fh, fw = self.photo.shape[:2]
            self.cx = float(rng.uniform(0, max(fw - w, 0)))
            self.cy = float(rng.uniform(0, max(fh - h, 0)))
        self.pan = (0.0, 0.0)
        n = int(rng.integers(0, self.d.clutter_max + 1))
        self.clutter = [self._make_stroke() for _ in range(n)]

    def _make_stroke(self) -> Tuple[str, np.ndarray, float, Tuple[float, float, float], int]:
        rng = self.rng
        sz = _lerp(*self.d.size_easy, t=rng.random()) * rng.uniform(0.4, 1.0)
        ox, oy = (0.0, 0.0) if self.video is not None else (self.cx, self.cy)
        cx = ox + rng.uniform(0, self.w)
        cy = oy + rng.uniform(0, self.h)
        contrast = rng.uniform(self.d.contrast_hard[0], self.d.contrast_easy[1])
        hue = (rng.uniform(0, 1, 3) * 0.8 + 0.2)
        thick = int(rng.integers(1, 3))
        if rng.random() < 0.5:  # partial arc: looks like a piece of 0/6/9
            pts = np.array([cx, cy, sz * 0.3, sz * 0.45, rng.uniform(0, 360), rng.uniform(90, 250)])
            return ("arc", pts, contrast, tuple(hue), thick)  # type: ignore[return-value]
        k = int(rng.integers(2, 4))
        pts = np.stack([cx + np.cumsum(rng.uniform(-sz / 2, sz / 2, k)),
                        cy + np.cumsum(rng.uniform(-sz / 2, sz / 2, k))], axis=1)
        return ("line", pts, contrast, tuple(hue), thick)  # type: ignore[return-value]

    def _background(self) -> np.ndarray:
        w, h = self.w, self.h
        if self.video is not None:
            src = self.video[self.vpos]
            self.vpos += self.vdir
            if self.vpos >= len(self.video) or self.vpos < 0:
                self.vdir = -self.vdir
                self.vpos += 2 * self.vdir
            x0, y0 = int(self.cx), int(self.cy)
            win = src[y0:y0 + self.vwin[1], x0:x0 + self.vwin[0]]
            src = cv2.resize(win, (w, h), interpolation=cv2.INTER_AREA)
        else:
            src = self.photo
            fh, fw = src.shape[:2]
            nx, ny = self.cx + self.pan[0], self.cy + self.pan[1]
            if not 0 <= nx <= fw - w:
                self.pan = (-self.pan[0], self.pan[1])
            if not 0 <= ny <= fh - h:
                self.pan = (self.pan[0], -self.pan[1])
            self.cx = min(max(self.cx + self.pan[0], 0.0), fw - w)
            self.cy = min(max(self.cy + self.pan[1], 0.0), fh - h)
        x0, y0 = (0, 0) if self.video is not None else (int(self.cx), int(self.cy))
        if self.flat is not None:  # test/debug mode: a flat background, nothing painted on it
            return np.full((h, w, 3), self.flat, np.uint8)
        bg = src[y0:y0 + h, x0:x0 + w]
        if bg.shape[0] != h or bg.shape[1] != w:
            bg = cv2.resize(src, (w, h), interpolation=cv2.INTER_AREA)
            x0 = y0 = 0
        bg = np.ascontiguousarray(bg)
        for kind, pts, contrast, hue, thick in self.clutter:
            p = pts.copy()
            if kind == "arc":
                c = (int(round(p[0] - x0)), int(round(p[1] - y0)))
                if not (-50 < c[0] < w + 50 and -50 < c[1] < h + 50):
                    continue
                color = self._ink(bg, c[0], c[1], contrast, np.array(hue, np.float32), 1.0)
                cv2.ellipse(bg, c, (max(1, int(p[2])), max(1, int(p[3]))), float(p[4]), 0.0,
                            float(p[5]), tuple(float(v) for v in color), thick, cv2.LINE_AA)
            else:
                q = np.round(p - np.array([x0, y0])).astype(np.int32)
                c = (int(q[0, 0]), int(q[0, 1]))
                color = self._ink(bg, c[0], c[1], contrast, np.array(hue, np.float32), 1.0)
                cv2.polylines(bg, [q.reshape(-1, 1, 2)], False, tuple(float(v) for v in color),
                              thick, cv2.LINE_AA)
        return bg

    def _ink(self, bg: np.ndarray, x: int, y: int, contrast: float, hue: np.ndarray,
             sign: float) -> np.ndarray:
        """Ink colour with luminance ``contrast``*255 away from the local background."""
        h, w = bg.shape[:2]
        x0, x1 = max(0, x - 8), min(w, x + 8)
        y0, y1 = max(0, y - 8), min(h, y + 8)
        if x1 <= x0 or y1 <= y0:
            lum = 128.0
        else:
            lum = float(bg[y0:y1, x0:x1].reshape(-1, 3).mean(axis=0) @ _LUMA)
        target = lum + sign * contrast * 255.0
        if target > 250 or target < 5:
            target = lum - sign * contrast * 255.0
        target = min(max(target, 3.0), 252.0)
        base = float(hue @ _LUMA)
        col = hue * (target / max(base, 1e-3))
        if col.max() > 255:  # saturated: blend towards grey of the same luminance
            col = np.full(3, target, np.float32)
        return np.clip(col, 0, 255).astype(np.float32)

    # ---------------------------------------------------------------- occluders
    def _init_occluders(self) -> None:
        rng, d = self.occ_rng, self.d
        self.occluders: List[_Occluder] = []
        n = int(rng.binomial(d.occluders_max, d.occluder_prob)) if d.occluders_max else 0
        photos = load_photos(self.split, 64)
        for _ in range(n):
            if rng.random() < 0.6:  # pole
                ow, oh = int(rng.integers(4, max(5, self.w // 12))), self.h
                y = 0.0
            else:  # board / box
                ow = int(rng.integers(self.w // 10, self.w // 4))
                oh = int(rng.integers(self.h // 10, self.h // 4))
                y = float(rng.uniform(0, self.h - oh))
            photo = photos[int(rng.integers(0, len(photos)))]
            py = int(rng.integers(0, max(1, photo.shape[0] - oh)))
            px = int(rng.integers(0, max(1, photo.shape[1] - ow)))
            tex = photo[py:py + oh, px:px + ow]
            if tex.shape[:2] != (oh, ow):
                tex = cv2.resize(photo, (ow, oh))
            tex = tex.astype(np.float32) * rng.uniform(0.5, 1.1)
            alpha = np.ones((oh, ow), np.float32)
            self.occluders.append(_Occluder(float(rng.uniform(-ow / 2, self.w - ow / 2)), y,
                                            float(rng.uniform(-0.5, 0.5)), ow, oh, tex, alpha))

    # ---------------------------------------------------------------- objects
    def _spawn(self, anywhere: bool, episode: Optional[Tuple[float, int]] = None) -> _Obj:
        """A new digit; ``episode`` = (hardness, ttl) for a hard-episode one (drawn from ep_rng)."""
        d = self.d
        rng = self.rng if episode is None else self.ep_rng
        if rng.random() < d.lookalike_prob:
            pair = LOOKALIKES[int(rng.integers(0, len(LOOKALIKES)))]
            cls = pair[int(rng.integers(0, 2))]
            lookalike = True
        else:
            cls = int(rng.integers(0, 10))
            lookalike = any(cls in p for p in LOOKALIKES)
        pool = self.sprites.by_class[cls]
        sprite = pool[int(rng.integers(0, len(pool)))]
        if episode is None:
            hz = float(np.clip(self.state.hardness + rng.normal(0, d.object_hardness_jitter), 0.0, 1.0))
        else:
            hz = episode[0]
        if d.horizon > 0:
            return self._spawn_on_ground(rng, cls, sprite, lookalike, hz, anywhere, episode)
        size = _lerp(float(rng.uniform(*d.size_easy)), float(rng.uniform(*d.size_hard)), hz)
        contrast = _lerp(float(rng.uniform(*d.contrast_easy)), float(rng.uniform(*d.contrast_hard)), hz)
        speed = float(rng.uniform(0, d.speed_max))
        a = float(rng.uniform(0, 2 * math.pi))
        vx, vy = speed * math.cos(a), speed * math.sin(a)
        if anywhere:
            x = float(rng.uniform(size / 2, self.w - size / 2))
            y = float(rng.uniform(size / 2, self.h - size / 2))
        else:  # enter from an edge, heading inwards
            edge = int(rng.integers(0, 4))
            x = float(rng.uniform(0, self.w)) if edge < 2 else (-size / 3 if edge == 2 else self.w + size / 3)
            y = float(rng.uniform(0, self.h)) if edge >= 2 else (-size / 3 if edge == 0 else self.h + size / 3)
            vx = abs(vx) if x < 0 else (-abs(vx) if x > self.w else vx)
            vy = abs(vy) if y < 0 else (-abs(vy) if y > self.h else vy)
        self._next_track += 1
        return _Obj(
            track_id=self._next_track, class_id=cls, sprite=sprite, x=x, y=y, vx=vx, vy=vy,
            size=size, scale_rate=float(rng.uniform(-d.scale_rate_max, d.scale_rate_max)),
            angle=float(rng.uniform(-d.rotation_max, d.rotation_max)), contrast=contrast,
            hue=(rng.uniform(0, 1, 3) * 0.85 + 0.15).astype(np.float32),
            sign=1.0 if rng.random() < 0.5 else -1.0, hardness=hz, lookalike=lookalike,
            ttl=int(rng.integers(30, 400)) if episode is None else episode[1], episodic=episode is not None)

    def _depth(self, y: float) -> float:
        """Depth factor k of image row ``y`` on the ground plane: 0 at the horizon, 1 at the bottom."""
        top = self.d.horizon * self.h
        return max((y - top) / max(self.h - top, 1.0), 0.0)

    def _spawn_on_ground(self, rng: np.random.Generator, cls: int, sprite: np.ndarray, lookalike: bool,
                         hz: float, anywhere: bool, episode: Optional[Tuple[float, int]]) -> _Obj:
        """A digit standing on the ground plane: its apparent height fixes its depth."""
        d, w, h = self.d, self.w, self.h
        far = episode is not None or rng.random() < d.far_prob
        phys = float(rng.uniform(*d.size_bottom))
        if far:
            size = float(rng.uniform(*d.far_size))
            contrast = float(rng.uniform(*d.far_contrast))
        else:
            size = _lerp(float(rng.uniform(*d.size_easy)), float(rng.uniform(*d.size_hard)), hz)
            contrast = _lerp(float(rng.uniform(*d.contrast_easy)), float(rng.uniform(*d.contrast_hard)), hz)
        k = min(size / phys, 1.0)
        top = d.horizon * h
        y = top + k * (h - top)
        speed = float(rng.uniform(0, d.speed_max))
        a = float(rng.uniform(0, 2 * math.pi))
        gvx, gvy = speed * math.cos(a), 0.25 * speed * math.sin(a)  # moving in depth is slower
        if anywhere:
            x = float(rng.uniform(size / 2, w - size / 2))
        else:  # walk in from the left or right edge
            x = -size / 3 if rng.random() < 0.5 else w + size / 3
            gvx = abs(gvx) if x < 0 else -abs(gvx)
        self._next_track += 1
        return _Obj(
            track_id=self._next_track, class_id=cls, sprite=sprite, x=x, y=y, vx=gvx * k, vy=gvy * k * k,
            size=size, scale_rate=0.0, angle=float(rng.uniform(-d.rotation_max, d.rotation_max)),
            contrast=contrast, hue=(rng.uniform(0, 1, 3) * 0.85 + 0.15).astype(np.float32),
            sign=1.0 if rng.random() < 0.5 else -1.0, hardness=hz, lookalike=lookalike,
            ttl=int(rng.integers(30, 400)) if episode is None else episode[1], episodic=episode is not None,
            phys=phys, gvx=gvx, gvy=gvy)

    def _move_on_ground(self, o: _Obj) -> None:
        """Image motion of a ground-plane digit: k x ground speed sideways, k^2 in depth."""
        k = self._depth(o.y)
        o.vx, o.vy = o.gvx * k, o.gvy * k * k
        o.x += o.vx
        o.y += o.vy
        o.size = max(o.phys * self._depth(o.y), 1.0)

    def _digit_alpha(self, o: _Obj) -> Tuple[int, int, np.ndarray]:
        """Alpha of ``o`` in frame coordinates: (x0, y0, alpha) unclipped."""
        tx0, ty0, tx1, ty1 = _tight(o.sprite)
        s = o.size / (ty1 - ty0)
        c = ((tx0 + tx1) / 2.0, (ty0 + ty1) / 2.0)
        m = cv2.getRotationMatrix2D(c, o.angle, s)
        corners = np.array([[tx0, ty0, 1], [tx1, ty0, 1], [tx0, ty1, 1], [tx1, ty1, 1]], np.float64)
        pts = corners @ m.T
        speed = math.hypot(o.vx, o.vy)
        blur = min(self.d.motion_blur_max, speed * self.d.motion_blur_gain)
        pad = int(math.ceil(blur)) + 2
        # centre the tight box on (o.x, o.y)
        mx = (pts[:, 0].min() + pts[:, 0].max()) / 2.0
        my = (pts[:, 1].min() + pts[:, 1].max()) / 2.0
        bw = int(math.ceil(pts[:, 0].max() - pts[:, 0].min())) + 2 * pad + 2
        bh = int(math.ceil(pts[:, 1].max() - pts[:, 1].min())) + 2 * pad + 2
        bx0 = int(math.floor(o.x - bw / 2.0))
        by0 = int(math.floor(o.y - bh / 2.0))
        m[0, 2] += (o.x - mx) - bx0
        m[1, 2] += (o.y - my) - by0
        alpha: np.ndarray = cv2.warpAffine(o.sprite, m, (bw, bh), flags=cv2.INTER_LINEAR,
                                           borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        if blur >= 1.5:
            k = int(round(blur)) | 1
            ker: np.ndarray = np.zeros((k, k), np.float32)
            cv2.line(ker, (0, k // 2), (k - 1, k // 2), 1.0, 1)
            rot = cv2.getRotationMatrix2D((k / 2 - 0.5, k / 2 - 0.5), -math.degrees(math.atan2(o.vy, o.vx)), 1.0)
            ker = cv2.warpAffine(ker, rot, (k, k))
            ker = (ker / max(float(ker.sum()), 1e-6)).astype(np.float32)
            alpha = cv2.filter2D(alpha, -1, ker, borderType=cv2.BORDER_CONSTANT)
            # motion blur spreads ink thinner: keep strokes readable by renormalising
            peak = float(alpha.max())
            if peak > 1e-3:
                alpha = np.minimum(alpha * min(1.0 / peak, 1.6), 1.0)
        return bx0, by0, alpha

    def _step_objects(self) -> None:
        rng, d = self.rng, self.d
        keep: List[_Obj] = []
        for o in self.objects:
            if d.horizon > 0:
                self._move_on_ground(o)
            else:
                o.x += o.vx
                o.y += o.vy
                o.size = float(np.clip(o.size * (1.0 + o.scale_rate), 6.0, max(d.size_easy[1], 8.0) * 1.3))
            o.ttl -= 1
            m = o.size
            inside = -m < o.x < self.w + m and -m < o.y < self.h + m and o.size >= 6.0
            if inside and o.ttl > 0:
                keep.append(o)
        self.objects = keep
        while sum(not o.episodic for o in self.objects) < self.target_objects:
            self.objects.append(self._spawn(anywhere=False))
        self._step_episode()
        if rng.random() < 0.01:
            self.target_objects = int(rng.integers(d.objects_min, d.objects_max + 1))
        # stream hardness: bounded random walk
        hs = self.state.hardness + float(rng.normal(0, d.hardness_drift))
        if hs < self._h_lo or hs > self._h_hi:
            hs = min(max(hs, self._h_lo), self._h_hi)
        self.state.hardness = hs
        for oc in self.occluders:
            oc.x += oc.vx

    def _step_episode(self) -> None:
        """Maybe start a hard episode: a burst of hard digits that stays its length, then leaves."""
        d, st = self.d, self.state
        if d.episode_rate <= 0:
            return
        if st.episode_left > 0:
            st.episode_left -= 1
            return
        rng = self.ep_rng
        if rng.random() >= d.episode_rate:
            return
        length = int(rng.integers(int(d.episode_frames[0]), int(d.episode_frames[1]) + 1))
        count = int(rng.integers(int(d.episode_objects[0]), int(d.episode_objects[1]) + 1))
        st.episode_left = length
        for _ in range(count):
            hz = float(rng.uniform(*d.episode_hardness))
            self.objects.append(self._spawn(anywhere=True, episode=(hz, length)))

    # ---------------------------------------------------------------- frame
    def next_frame(self) -> Tuple[np.ndarray, List[ObjectLabel]]:
        """Render the next frame (BGR uint8, h x w x 3) and its labels."""
        if self.state.frame_index > 0:
            self._step_objects()
        self.state.frame_index += 1
        w, h = self.w, self.h
        bg = self._background()
        layers: List[_Layer] = []
        for o in self.objects:  # back to front: spawn order
            bx0, by0, alpha = self._digit_alpha(o)
            full = int((alpha >= ALPHA_THRESHOLD).sum())
            cx0, cy0 = max(bx0, 0), max(by0, 0)
            cx1, cy1 = min(bx0 + alpha.shape[1], w), min(by0 + alpha.shape[0], h)
            if cx1 <= cx0 or cy1 <= cy0:
                clipped = np.zeros((0, 0), np.float32)
            else:
                clipped = alpha[cy0 - by0:cy1 - by0, cx0 - bx0:cx1 - bx0]
            color = self._ink(bg, int(o.x), int(o.y), o.contrast, o.hue, o.sign)
            layers.append(_Layer(cx0, cy0, clipped, color, o, full))
        for oc in self.occluders:  # occluders in front of every digit
            ox0, oy0 = int(round(oc.x)), int(round(oc.y))
            cx0, cy0 = max(ox0, 0), max(oy0, 0)
            cx1, cy1 = min(ox0 + oc.w, w), min(oy0 + oc.h, h)
            if cx1 <= cx0 or cy1 <= cy0:
                continue
            sl = (slice(cy0 - oy0, cy1 - oy0), slice(cx0 - ox0, cx1 - ox0))
            layers.append(_Layer(cx0, cy0, oc.alpha[sl], oc.texture[sl]))
        # labels: front to back with a coverage map
        cover = np.zeros((h, w), np.float32)
        labels: List[ObjectLabel] = []
        for layer in reversed(layers):
            a = layer.alpha
            if a.size == 0:
                if layer.obj is not None:
                    labels.append(self._label(layer.obj, None, 0.0))
                continue
            ys, xs = slice(layer.y0, layer.y0 + a.shape[0]), slice(layer.x0, layer.x0 + a.shape[1])
            c = cover[ys, xs]
            if layer.obj is not None:
                vis = a * (1.0 - c)
                mask = vis >= ALPHA_THRESHOLD
                n = int(mask.sum())
                if n:
                    rows = np.nonzero(mask.any(axis=1))[0]
                    cols = np.nonzero(mask.any(axis=0))[0]
                    box = (layer.x0 + int(cols[0]), layer.y0 + int(rows[0]),
                           layer.x0 + int(cols[-1]) + 1, layer.y0 + int(rows[-1]) + 1)
                else:
                    box = None
                labels.append(self._label(layer.obj, box, n / max(layer.full_count, 1)))
            cover[ys, xs] = c + a * (1.0 - c)
        labels.reverse()
        # composite back to front
        img = bg.astype(np.float32)
        for layer in layers:
            a = layer.alpha
            if a.size == 0:
                continue
            roi = img[layer.y0:layer.y0 + a.shape[0], layer.x0:layer.x0 + a.shape[1]]
            a3 = a[:, :, None]
            roi *= 1.0 - a3
            roi += a3 * layer.color
        if self.state.low_light:
            img *= self.state.gain
        sigma = _lerp(self.d.noise_easy, self.d.noise_hard, self.state.hardness)
        if sigma > 0:
            img += self.rng.standard_normal((h, w, 3), dtype=np.float32) * np.float32(sigma)
        out = np.clip(img + 0.5, 0, 255).astype(np.uint8)
        return out, labels

    def _label(self, o: _Obj, box: Optional[Tuple[int, int, int, int]], visible: float) -> ObjectLabel:
        ok = box is not None and visible >= self.d.min_visible
        return ObjectLabel(
            track_id=o.track_id, class_id=o.class_id, box=box or (0, 0, 0, 0),
            visible=float(round(visible, 4)), labelled=bool(ok), size_px=float(round(o.size, 2)),
            contrast=float(round(o.contrast, 4)), hardness=float(round(o.hardness, 4)),
            lookalike=o.lookalike)
