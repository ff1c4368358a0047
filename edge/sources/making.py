"""The source for one stream's settings. Callers: ``edge.daemon``."""

from __future__ import annotations

import logging

from edge.settings import StreamSettings
from edge.sources.base import FrameSource
from edge.sources.opencv import CaptureSource, ImageFolderSource, VideoFileSource
from edge.sources.synthetic import SyntheticSource

log = logging.getLogger(__name__)


def make_source(s: StreamSettings) -> FrameSource:
    """The source for one stream's settings; a live one logs how it will be read."""
    if s.kind == "file":
        return VideoFileSource(s.uri, loop=s.loop)
    if s.kind == "folder":
        return ImageFolderSource(s.uri, loop=s.loop)
    if s.kind == "synthetic":
        return SyntheticSource(s.id, s.uri)
    src = CaptureSource(s.kind, s.uri, backend=s.backend, transport=s.rtsp_transport, codec=s.codec,
                        stall_timeout_s=s.stall_timeout_s, open_timeout_s=s.open_timeout_s,
                        io_timeout_s=s.io_timeout_s)
    log.info("stream %s: %s, latest-frame capture", s.id, src.describe())
    return src
