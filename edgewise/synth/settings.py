"""Difficulty knobs of the procedural scene generator: one validated, documented dataclass.

``Difficulty`` holds every knob; ``PRESETS`` names a few ready-made mixes
("easy", "medium", "hard", "reference", "episodes", "camera"; :func:`default_layout` the
frame size, streams, frames and pool a preset is meant for); :func:`load_difficulty` builds one from
a preset name, a JSON/YAML file, or ``key=value`` overrides with the settings
loader of :mod:`edgewise.settings` (same coercion, unknown keys rejected with a
did-you-mean, each error naming the file line or override of the bad value).
:meth:`Difficulty.check_frame` is the one rule for frame sizes (the tallest digit the
knobs draw must fit in the frame), shared by ``edgewise synth`` and every
:class:`~edgewise.synth.StreamGenerator` (so the edge's ``synthetic`` source too).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from edgewise.errors import ConfigError
from edgewise.settings.building import build_section
from edgewise.settings.tree import Source, Val, describe, read_yaml, set_override, to_val


@dataclass(frozen=True)
class Difficulty:
    """How hard the generated scenes are.

    Every per-object quantity is drawn between its ``*_easy`` and ``*_hard`` end,
    moved towards the hard end by the stream's current hardness ``h`` in [0, 1]
    (a slow random walk per stream, so some stretches of a camera stream are
    hard and others easy: the situation edge/cloud escalation is made for).
    """

    #: objects visible at once (inclusive range); objects enter and leave.
    objects_min: int = 3
    objects_max: int = 10
    #: digit height in pixels at hardness 0 (large) and 1 (small).
    size_easy: Tuple[float, float] = (28.0, 56.0)
    size_hard: Tuple[float, float] = (9.0, 16.0)
    #: ink/background luminance difference as a fraction of 255.
    contrast_easy: Tuple[float, float] = (0.35, 0.7)
    contrast_hard: Tuple[float, float] = (0.07, 0.16)
    #: mean stream hardness and how fast it drifts per frame (random walk step).
    hardness_mean: float = 0.5
    hardness_spread: float = 0.35
    hardness_drift: float = 0.03
    #: standard deviation of an object's hardness around its stream's at spawn.
    object_hardness_jitter: float = 0.2
    #: hard episodes: per frame outside one, the probability that one starts (0: none).
    #: An episode is a burst of ``episode_objects`` digits with hardness drawn from
    #: ``episode_hardness`` that appear and stay ``episode_frames`` frames, then leave:
    #: short hard stretches in otherwise easy streams, which is what an escalation
    #: policy has to find.
    episode_rate: float = 0.0
    episode_frames: Tuple[float, float] = (8.0, 24.0)
    episode_objects: Tuple[float, float] = (1.0, 3.0)
    episode_hardness: Tuple[float, float] = (0.75, 1.0)
    #: probability per frame-layer of an occluding background patch, and max patches.
    occluder_prob: float = 0.5
    occluders_max: int = 2
    #: objects whose visible fraction (after occlusion and frame edges) is
    #: below this are not labelled (see edgewise.synth.render docs).
    min_visible: float = 0.5
    #: max speed in px/frame and max relative scale change per frame.
    speed_max: float = 3.0
    scale_rate_max: float = 0.01
    #: max in-plane rotation in degrees.
    rotation_max: float = 12.0
    #: motion-blur length scale: blur length = speed * this (px), capped by motion_blur_max.
    motion_blur_gain: float = 1.5
    motion_blur_max: float = 7.0
    #: gaussian sensor noise sigma (0..255 units) at hardness 0 and 1.
    noise_easy: float = 2.0
    noise_hard: float = 10.0
    #: probability that a stream is a low-light one, and its gain range.
    low_light_prob: float = 0.25
    low_light_gain: Tuple[float, float] = (0.25, 0.55)
    #: distractor strokes (unlabelled clutter in ink colours) per frame, max.
    clutter_max: int = 4
    #: probability that a new object is drawn from a look-alike pair (1/7, 3/8, 4/9, 5/6).
    lookalike_prob: float = 0.4
    #: camera geometry (0: off, the flat scenes of the other presets). Above 0, a fixed
    #: camera looks over a ground plane whose horizon lies at this fraction of the frame
    #: height from the top: a digit's apparent height grows linearly with its distance
    #: below the horizon (a pinhole camera over flat ground), so far digits are small, sit
    #: near the horizon and move slowly, near ones are large, low and fast. ``size_easy`` /
    #: ``size_hard`` are then the apparent heights of near digits; the background is static.
    horizon: float = 0.0
    #: with ``horizon``: a digit's height if it stood at the bottom edge of the frame (its
    #: physical size; its depth follows from the apparent height drawn for it).
    size_bottom: Tuple[float, float] = (110.0, 150.0)
    #: with ``horizon``: apparent height and ink contrast of *far* digits. Far digits are
    #: clean (good contrast): what makes them hard is their size after a downscale.
    far_size: Tuple[float, float] = (16.0, 28.0)
    far_contrast: Tuple[float, float] = (0.35, 0.65)
    #: with ``horizon``: probability that a digit outside an episode is a far one (episode
    #: digits are always far: an episode is a burst of far digits).
    far_prob: float = 0.0

    def validate(self, where: str = "difficulty") -> Difficulty:
        """Check ranges; raise ConfigError naming the key; return self."""

        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"{where}: key '{key}' {why}")

        if not 0 <= self.objects_min <= self.objects_max <= 64:
            raise bad("objects_min/objects_max", "must satisfy 0 <= objects_min <= objects_max <= 64")
        for key in ("size_easy", "size_hard", "contrast_easy", "contrast_hard", "low_light_gain",
                    "episode_frames", "episode_objects", "episode_hardness", "size_bottom", "far_size",
                    "far_contrast"):
            lo, hi = getattr(self, key)
            if not 0 < lo <= hi:
                raise bad(key, f"must be a [low, high] pair with 0 < low <= high, got {[lo, hi]}")
        for key in ("size_easy", "size_hard", "size_bottom", "far_size"):
            if getattr(self, key)[1] > 400:
                raise bad(key, "digit height above 400 px is not supported")
        for key in ("contrast_easy", "contrast_hard", "low_light_gain", "episode_hardness", "far_contrast"):
            if getattr(self, key)[1] > 1.0:
                raise bad(key, "values are fractions and must be <= 1")
        for key in ("hardness_mean", "hardness_spread", "occluder_prob", "min_visible",
                    "low_light_prob", "lookalike_prob", "object_hardness_jitter", "episode_rate", "far_prob"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1.0:
                raise bad(key, f"must be within [0, 1], got {v}")
        for key in ("hardness_drift", "speed_max", "scale_rate_max", "rotation_max",
                    "motion_blur_gain", "motion_blur_max", "noise_easy", "noise_hard"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1000.0:
                raise bad(key, f"must be a non-negative number, got {v}")
        if self.scale_rate_max >= 0.5:
            raise bad("scale_rate_max", "must be < 0.5 (relative change per frame)")
        if not 0 <= self.occluders_max <= 16 or not 0 <= self.clutter_max <= 64:
            raise bad("occluders_max/clutter_max", "must be within [0, 16] / [0, 64]")
        for key in ("episode_frames", "episode_objects"):
            lo, hi = getattr(self, key)
            if not (float(lo).is_integer() and float(hi).is_integer()) or hi > 1000:
                raise bad(key, f"must be a [low, high] pair of whole numbers up to 1000, got {[lo, hi]}")
        if self.min_visible <= 0.0:
            raise bad("min_visible", "must be > 0 (a fully hidden object cannot be labelled)")
        if not 0.0 <= self.horizon <= 0.9:
            raise bad("horizon", f"must be within [0, 0.9] (0: no ground plane), got {self.horizon}")
        if self.horizon > 0 and max(self.far_size[1], self.size_easy[1], self.size_hard[1]) > self.size_bottom[0]:
            raise bad("size_bottom", "must be at least every apparent height (size_easy, size_hard, far_size): "
                      "nothing is larger than at the bottom edge of the frame")
        return self

    def size_knobs(self) -> Tuple[str, ...]:
        """The knobs that set the apparent height of a drawn digit (its spawn size).

        ``far_size`` counts only where far digits can appear (a ground plane with
        ``far_prob`` or ``episode_rate`` above 0); ``size_bottom`` is a physical size,
        not a drawn one, and does not count.
        """
        if self.horizon > 0 and (self.far_prob > 0 or self.episode_rate > 0):
            return ("size_easy", "size_hard", "far_size")
        return ("size_easy", "size_hard")

    def tallest_digit(self) -> float:
        """The apparent height (px) of the tallest digit these knobs can draw."""
        return max(float(getattr(self, key)[1]) for key in self.size_knobs())

    def min_frame_side(self) -> int:
        """The smallest frame width and height (px) these knobs work at: the tallest digit
        they can draw must fit in the frame."""
        return int(math.ceil(self.tallest_digit()))

    def check_frame(self, width: int, height: int, where: str = "difficulty") -> Difficulty:
        """Check that a ``width`` x ``height`` frame can hold every digit these knobs draw.

        A digit is placed wholly inside the frame, so the frame must be at least as wide
        and as tall as the tallest one. Raises ConfigError naming the frame size, the
        conflicting knobs and the smallest size that works; returns self.
        """
        side = min(width, height)
        need = self.min_frame_side()
        if side >= need:
            return self
        over = [key for key in self.size_knobs() if getattr(self, key)[1] > side]
        names = ", ".join(f"'{key}' ({_fmt(getattr(self, key))})" for key in over)
        one = len(over) == 1
        raise ConfigError(
            f"{where}: frame size {width}x{height} is too small for {'key' if one else 'keys'} {names}: "
            f"{'it draws' if one else 'they draw'} digits up to {self.tallest_digit():g} px tall and a digit "
            f"must fit in the frame, so frames must be at least {need} px wide and {need} px tall; use a frame "
            f"of at least {max(width, need)}x{max(height, need)}, or lower the high end of "
            f"{' and '.join(repr(key) for key in over)} to {side} or less")

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


def _fmt(pair: Tuple[float, float]) -> str:
    return f"{pair[0]:g},{pair[1]:g}"


PRESETS: Dict[str, Difficulty] = {
    "easy": Difficulty(objects_min=1, objects_max=6, hardness_mean=0.15, hardness_spread=0.15, occluder_prob=0.1,
                       low_light_prob=0.0, clutter_max=1, lookalike_prob=0.2),
    "medium": Difficulty(hardness_mean=0.4, hardness_spread=0.3),
    "hard": Difficulty(hardness_mean=0.75, hardness_spread=0.25, occluder_prob=0.7,
                       low_light_prob=0.4, clutter_max=6, lookalike_prob=0.6),
    # The reference pair's training/eval mix: mostly easy stretches (stream
    # hardness in [0, 0.6]) with a minority of small / faint / occluded /
    # look-alike digits that the edge model (at a lower input size) misses and the
    # cloud model can fix; 2-8 digits per frame so a CPU-trained model sees many
    # objects per image. Sized so the pair trains in about 2 hours on 2 CPU cores.
    "reference": Difficulty(objects_min=2, objects_max=8, size_easy=(26.0, 48.0), size_hard=(10.0, 16.0),
                            contrast_easy=(0.35, 0.7), contrast_hard=(0.1, 0.2), hardness_mean=0.3,
                            hardness_spread=0.3, occluder_prob=0.4, low_light_prob=0.2, clutter_max=3),
    # The deployment mix the hybrid is judged on: the reference pair's objects, but
    # streams are easy (hardness 0-0.2) except for short hard episodes, bursts of
    # small / faint / occluded digits in about 10% of frames (episode_rate 0.01,
    # 8-24 frames each): the few hard frames that escalation exists to find.
    "episodes": Difficulty(objects_min=2, objects_max=8, size_easy=(26.0, 48.0), size_hard=(10.0, 16.0),
                           contrast_easy=(0.35, 0.7), contrast_hard=(0.1, 0.2), hardness_mean=0.1,
                           hardness_spread=0.1, object_hardness_jitter=0.1, occluder_prob=0.4,
                           low_light_prob=0.1, clutter_max=3, episode_rate=0.01,
                           episode_hardness=(0.65, 1.0)),
    # A fixed camera at camera resolution (PRESET_SIZES: 1280x720) over a ground plane
    # (horizon at 35% of the height): near digits 48-128 px, far ones 16-28 px near the
    # horizon, clean but a few pixels after an edge model's 4x downscale, slow. Streams
    # are easy (hardness 0-0.2) with 5% far digits; episodes (episode_rate 0.01, 8-24
    # frames) bring bursts of 8-16 far digits, so a minority of frames carries most of
    # what a full-resolution cloud model finds and the edge cannot (docs/design/escalation.md#the-camera-world).
    "camera": Difficulty(objects_min=2, objects_max=6, size_easy=(64.0, 128.0), size_hard=(48.0, 80.0),
                         contrast_easy=(0.35, 0.7), contrast_hard=(0.18, 0.3), hardness_mean=0.1,
                         hardness_spread=0.1, object_hardness_jitter=0.1, occluder_prob=0.4,
                         low_light_prob=0.15, low_light_gain=(0.35, 0.6), clutter_max=3, episode_rate=0.01,
                         episode_objects=(8.0, 16.0), speed_max=6.0,
                         noise_easy=2.0, noise_hard=8.0, horizon=0.35, size_bottom=(150.0, 190.0), far_prob=0.05),
}

@dataclass(frozen=True)
class Layout:
    """What ``edgewise synth`` makes when the command line does not say: the frame size
    (width, height), the number of streams, frames per stream and the sprite/background
    pool (``split``)."""

    width: int
    height: int
    streams: int
    frames: int
    split: str


#: The layout a preset is meant for when the command line gives none. ``camera`` is the
#: camera world's headline setting (its held-out ``test`` pool, 30 streams of 30 frames at
#: 1280x720: the ``cam-test`` split of ``scripts/camera_data.sh`` from any seed); presets not
#: listed make 4 streams of 100 frames of 320x240 from the ``train`` pool.
PRESET_LAYOUTS: Dict[str, Layout] = {"camera": Layout(1280, 720, 30, 30, "test")}
DEFAULT_LAYOUT = Layout(320, 240, 4, 100, "train")
#: The frame size (width, height) of each preset's layout.
PRESET_SIZES: Dict[str, Tuple[int, int]] = {k: (v.width, v.height) for k, v in PRESET_LAYOUTS.items()}
DEFAULT_SIZE: Tuple[int, int] = (DEFAULT_LAYOUT.width, DEFAULT_LAYOUT.height)


def default_layout(spec: str) -> Layout:
    """The :class:`Layout` for a preset name or a difficulty file (its ``preset:`` key)."""
    name = spec
    if spec not in PRESETS and Path(spec).is_file():
        try:
            tree = read_yaml(Path(spec), "difficulty")
        except ConfigError:
            return DEFAULT_LAYOUT  # load_difficulty reports the file's error
        preset = tree.data.get("preset")
        name = str(preset.data) if preset is not None else "reference"
    return PRESET_LAYOUTS.get(name, DEFAULT_LAYOUT)


def default_size(spec: str) -> Tuple[int, int]:
    """The frame size of :func:`default_layout`."""
    layout = default_layout(spec)
    return layout.width, layout.height


def difficulty_from_mapping(data: Mapping[str, Any], base: Optional[Difficulty] = None,
                            where: str = "difficulty") -> Difficulty:
    """Override ``base`` (default: reference preset) with ``data``; unknown keys rejected.

    Values follow the settings coercion table (:mod:`edgewise.settings.values`): a pair
    may be a list or ``"low,high"`` text, an int may be ``3``, ``3.0`` or ``"3"``.
    """
    values = {k: v for k, v in data.items() if k != "preset"}
    return _build(to_val(values, Source(where)), base or PRESETS["reference"], where)


def _build(val: Val, base: Difficulty, where: str) -> Difficulty:
    diff: Difficulty = build_section(Difficulty, val, base)
    return diff.validate(where)


def load_difficulty(spec: str = "reference", overrides: Sequence[str] = ()) -> Difficulty:
    """Build Difficulty from a preset name or a JSON/YAML file, then ``key=value`` overrides.

    Raises:
        ConfigError: naming the file line or the override of a bad key or value.
    """
    if spec in PRESETS:
        diff = PRESETS[spec]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(
                f"difficulty '{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file")
        tree = read_yaml(path, "difficulty")  # JSON is YAML too
        preset = tree.data.pop("preset", None)
        name = "reference" if preset is None else preset.data
        if not isinstance(name, str) or name not in PRESETS:
            name = describe(name) if isinstance(name, (dict, list)) else repr(name)
            where = preset.key_src.label if preset is not None else str(path)
            raise ConfigError(f"{where}: preset: {name} is not allowed; allowed: {' | '.join(PRESETS)}")
        diff = _build(tree, PRESETS[name], str(path))
    if not overrides:
        return diff.validate()
    items = Val({}, Source("--set"))
    for item in overrides:
        ov = set_override(item)
        items.data[".".join(ov.path)] = Val(ov.value.strip(), ov.src, text=True)
    return _build(items, diff, "--set")
