"""Damage a real spool file the way the chaos probe did: the page-type byte of an index's
root page flipped, as a bad flash block or a torn write leaves it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Tuple, Union

#: SQLite's name for the index of ``items.key UNIQUE`` (the one every put and ack updates)
KEY_INDEX = "sqlite_autoindex_items_1"
#: the index the caps and stats read (``edge.spool.AGE_INDEX``)
AGE_INDEX = "items_age"


def damage_index(path: Union[str, Path], index: str = KEY_INDEX) -> None:
    """Flip the page-type byte of ``index``'s root page in the spool file at ``path`` (found
    through ``sqlite_master.rootpage`` and the page size), after folding the WAL into the file.
    A ``Spool`` that has the file open
    reads the damaged page once another connection has written (``nudge``)."""
    db = sqlite3.connect(str(path))
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the index's pages into the file itself
        root = int(db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0])
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
    finally:
        db.close()
    assert root > 1, root  # page 1 starts with the file header, never an index's root
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page)
        byte = fh.read(1)[0]
        fh.seek((root - 1) * page)
        fh.write(bytes([byte ^ 0xFF]))


def nudge(path: Union[str, Path]) -> None:
    """Commit a write from another connection (a counter bumped and put back), so that a
    ``Spool`` holding the file open drops its page cache and reads the file again."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("UPDATE counters SET value = value + 1 WHERE name = 'refused_too_large'")
        db.execute("UPDATE counters SET value = value - 1 WHERE name = 'refused_too_large'")
    finally:
        db.close()


def _page_holding(path: Union[str, Path], marker: bytes) -> Tuple[int, int]:
    """(page size, number of the page whose bytes hold ``marker``), after folding the WAL into
    the file."""
    db = sqlite3.connect(str(path))
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
    finally:
        db.close()
    data = Path(path).read_bytes()
    at = data.find(marker)
    assert at >= 0 and data.find(marker, at + 1) < 0, "the marker must be in the file once"
    number = at // page + 1
    assert number > 1
    return page, number


def damage_page_holding(path: Union[str, Path], marker: bytes) -> int:
    """Flip the page-type byte of the page whose bytes hold ``marker`` (an item's payload,
    stored on a table leaf page), after folding the WAL into the file; returns the page's
    number. The items on that page become unreadable, the others stay readable."""
    page, number = _page_holding(path, marker)
    with open(path, "r+b") as fh:
        fh.seek((number - 1) * page)
        byte = fh.read(1)[0]
        fh.seek((number - 1) * page)
        fh.write(bytes([byte ^ 0xFF]))
    return number


def garble_page_holding(path: Union[str, Path], marker: bytes, seed: int = 7) -> int:
    """Overwrite the whole page whose bytes hold ``marker`` (an item's payload on a table leaf
    page) with garbage, as a bad flash block returns it, after folding the WAL into the file;
    returns the page's number. The items that start on that page become unreadable."""
    import random

    page, number = _page_holding(path, marker)
    rng = random.Random(seed)
    garbage = bytes(rng.getrandbits(8) for _ in range(page))
    assert garbage[0] not in (2, 5, 10, 13), "the garbage must not start like a b-tree page"
    with open(path, "r+b") as fh:
        fh.seek((number - 1) * page)
        fh.write(garbage)
    return number


def tear_page_holding(path: Union[str, Path], marker: bytes, sector: int = 512) -> int:
    """Zero the page whose bytes hold ``marker`` from the sector holding it to the page's end,
    after folding the WAL into the file, as a power cut leaves a page whose later sectors never
    reached the card (or a card that acknowledged a write it had only cached); returns the page's
    number. On an item's last overflow page (``marker`` its ``meta``) the b-tree stays sound,
    ``PRAGMA quick_check`` says ok, and the row reads back as zeros."""
    page, number = _page_holding(path, marker)
    at = Path(path).read_bytes().find(marker)
    start = at - at % sector
    with open(path, "r+b") as fh:
        fh.seek(start)
        fh.write(bytes(number * page - start))
    return number


def salvage_until_killed(path: Union[str, Path], mode: str) -> None:
    """(The child process of the crash tests.) Salvage the spool at ``path`` with the copy
    slowed, saying ``batch N`` on stdout after each batch it stored, and wait to be killed after
    the second: ``in-use`` opens the sound spool, damages its key index under it and salvages it
    in place (``salvage_in_use``), as the daemon's spool thread does; ``start`` opens a damaged
    spool as a start does (``open_spool``)."""
    import time

    from edge.spool import Spool, SpoolCorrupt
    from edge.spool_salvage import open_spool, salvage_in_use

    real = Spool.adopt
    stored = [0]

    def adopt(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        stored[0] += 1
        print(f"batch {stored[0]}", flush=True)
        if stored[0] >= 2:
            time.sleep(600)  # the copy half done: killed here
        return result

    Spool.adopt = adopt  # type: ignore[method-assign]
    if mode == "in-use":
        spool = Spool(path, max_bytes=1 << 30, max_age_s=3600)
        damage_index(path, KEY_INDEX)
        nudge(path)
        try:
            spool.put("dev/cam/new", b"x", {})
        except SpoolCorrupt:
            pass
        assert spool.damaged is not None
        salvage_in_use(spool)
    else:
        open_spool(path, max_bytes=1 << 30, max_age_s=3600)
    print("finished", flush=True)  # not reached when killed


if __name__ == "__main__":
    import sys

    salvage_until_killed(sys.argv[1], sys.argv[2])
