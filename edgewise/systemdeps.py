"""Python modules that ``pip install edgewise`` does not bring, and the one line that says what
installs each, shown in place of the import's traceback by the command dispatcher (any
``edgewise`` command, as it loads a command or runs it) and by the Jetson package's ``setup.sh``:

* modules the platform provides, not pip: on a Jetson they are JetPack's builds (the bundle's
  venv sees them through ``--system-site-packages``), so a device without them fails at the
  first import;
* modules of an optional extra (pyproject.toml): paho-mqtt (``edge``, ``cloud``) and the
  kubernetes client (``cloud``), imported only by what uses them; :func:`require` checks
  one before a daemon starts.

Imports nothing (``setup.sh`` runs it before the venv is complete).
"""

from __future__ import annotations

from typing import Dict, Optional

from edgewise.errors import DeploymentError

#: top-level module name -> what installs it
INSTALL_HINTS: Dict[str, str] = {
    "cv2": "OpenCV's Python module (cv2) is not installed: on a Jetson it comes with JetPack: "
           "sudo apt-get install libopencv-python (or Ubuntu's python3-opencv, which lacks NVIDIA's "
           "GStreamer elements for CSI cameras and hardware decoding); elsewhere: "
           "pip install opencv-python-headless",
    "paho": "paho-mqtt is not installed, and MQTT needs it (the edge's cloud.mqtt, the gateway's MQTT bridge): "
            "pip install 'edgewise[edge]' on a device, 'edgewise[cloud]' for the cloud tier",
    "kubernetes": "the kubernetes client is not installed, and the cloud tier's Kubernetes discovery and "
                  "autoscaler need it: pip install 'edgewise[cloud]'",
}


def missing_module_error(exc: ImportError) -> Optional[DeploymentError]:
    """The one-line error for ``exc`` when it is a platform module that is not installed
    (:data:`INSTALL_HINTS`), else None (a real error, whose traceback is wanted)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    hint = INSTALL_HINTS.get(exc.name.split(".")[0])
    return DeploymentError(f"{hint} ({exc})") if hint else None


def require(module: str) -> None:
    """Import ``module`` (one of :data:`INSTALL_HINTS`'s), or raise its one-line error."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as exc:
        missing = missing_module_error(exc)
        if missing is None:
            raise
        raise missing from None
