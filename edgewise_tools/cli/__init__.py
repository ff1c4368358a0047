"""Handlers of the offline commands (``edgewise model|synth|train|eval|demo``).

Each module exposes ``register(subparsers)``; the dispatcher in
:mod:`edgewise.cli` finds them by module name.
"""
