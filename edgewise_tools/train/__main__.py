"""``python -m edgewise_tools.train``: command-line front end of :func:`edgewise_tools.train.train`."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from edgewise_tools.cli.train import add_train_arguments, run_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgewise train", description="train a YOLOv5 on a YOLO-txt dataset")
    add_train_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_args(build_parser().parse_args(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
