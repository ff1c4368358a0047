"""``python -m edgewise``: the same as the ``edgewise`` command."""

from __future__ import annotations

import sys

from edgewise.cli import main

sys.exit(main())
