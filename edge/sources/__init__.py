"""Frame sources of the edge daemon.

``FrameSource`` (``base``) is the seam; ``opencv`` holds the file/folder/live
sources, ``latest`` the latest-frame reader of live ones, ``live`` how a live
stream is opened, ``clock`` its frame timestamps, ``synthetic`` the generated
source, ``capturing`` the async capture shell and ``making`` the factory that
builds a source from a stream's settings (kept out of this package's imports so
``edge.settings`` can use ``live`` without an import cycle).
"""

from __future__ import annotations

from edge.sources.base import CorruptFrameError, Frame, FrameSource, SourceError, SourceState
from edge.sources.opencv import CaptureSource, ImageFolderSource, VideoFileSource
from edge.sources.synthetic import SyntheticSource

__all__ = [
    "CaptureSource",
    "CorruptFrameError",
    "Frame",
    "FrameSource",
    "ImageFolderSource",
    "SourceError",
    "SourceState",
    "SyntheticSource",
    "VideoFileSource",
]
