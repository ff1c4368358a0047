"""`python -m edgewise.cli` runs the CLI."""

from __future__ import annotations

import sys

from edgewise.cli import main

sys.exit(main())
