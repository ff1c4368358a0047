"""Frame sources of the edge daemon and the factory that builds one from settings.

``FrameSource`` (``base``) is the seam; ``opencv`` holds the file/folder/live
sources, ``synthetic`` the generated one, ``capturing`` the async capture shell.
"""

from __future__ import annotations

from edge.settings import StreamSettings
from edge.sources.base import CorruptFrameError, Frame, FrameSource, SourceError, SourceState
from edge.sources.opencv import CaptureSource, ImageFolderSource, VideoFileSource
from edge.sources.synthetic import SyntheticSource


def make_source(s: StreamSettings) -> FrameSource:
    """The source for one stream's settings."""
    if s.kind == "file":
        return VideoFileSource(s.uri, loop=s.loop)
    if s.kind == "folder":
        return ImageFolderSource(s.uri, loop=s.loop)
    if s.kind == "synthetic":
        return SyntheticSource(s.id, s.uri)
    return CaptureSource(s.kind, s.uri)


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
    "make_source",
]
