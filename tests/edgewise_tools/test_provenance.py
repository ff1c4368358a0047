"""The provenance block's commit: a tree's uncommitted changes are named, and a run that
writes its reports into the tree takes the state before it writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from edgewise_tools.provenance import NAMED, git_state, markdown, provenance


def _repo(tmp_path: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    for name in ("a.py", "b.py", "old.md", *(f"r{i}.json" for i in range(NAMED + 2))):
        (tmp_path / name).write_text("x\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return tmp_path


def test_a_clean_tree_is_its_commit_and_a_changed_one_names_its_files(tmp_path) -> None:
    root = _repo(tmp_path)
    commit, changed = git_state(root)
    assert len(commit) == 12 and "+" not in commit and changed == []
    (root / "a.py").write_text("y\n")
    subprocess.run(["git", "-C", str(root), "mv", "old.md", "new.md"], check=True)
    (root / "untracked.txt").write_text("not part of the tree\n")
    commit2, changed = git_state(root)
    assert commit2 == commit + "+dirty"
    assert sorted(changed) == ["a.py", "new.md"]  # a rename once, by its new name; untracked files are not changes


def test_the_block_names_at_most_a_few_changed_files(tmp_path) -> None:
    root = _repo(tmp_path)
    for i in range(NAMED + 2):
        (root / f"r{i}.json").write_text("y\n")
    block = provenance({}, state=git_state(root))
    assert block["commit"].endswith("+dirty")
    assert len(block["uncommitted"]) == NAMED + 1 and block["uncommitted"][-1] == "2 more"
    assert "(uncommitted: r" in markdown(block)
    assert "uncommitted" not in provenance({}, state=("0123456789ab", []))


def test_a_changed_file_whose_name_is_not_utf8_is_named_not_a_crash(tmp_path) -> None:
    """``status -z`` writes paths unquoted: a tracked file named in Latin-1 ended the run that
    took the state (UnicodeDecodeError) before a model ran."""
    root = _repo(tmp_path)
    name = b"caf\xe9 old.md"
    with open(bytes(root) + b"/" + name, "w") as f:
        f.write("x\n")
    subprocess.run(["git", "-C", str(root), "add", "."], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "l1"],
                   check=True, capture_output=True)
    with open(bytes(root) + b"/" + name, "w") as f:
        f.write("y\n")
    commit, changed = git_state(root)
    assert commit.endswith("+dirty") and changed == ["caf\ufffd old.md"]


def test_an_installed_package_inside_another_repository_has_no_commit(tmp_path) -> None:
    """A pip-installed edgewise in a venv inside a project's repository (``myproject/.venv``):
    ``eval`` and the demo reported that project's commit, ``+dirty``, with its changed files, as
    the commit that produced the figures."""
    root = _repo(tmp_path)
    (root / "a.py").write_text("y\n")
    site = root / ".venv" / "lib" / "python3.11" / "site-packages"  # where edgewise_tools' ROOT is then
    site.mkdir(parents=True)
    assert git_state(root)[0].endswith("+dirty")
    assert git_state(site) == ("unknown", [])


def test_a_dataset_json_whose_nc_and_names_disagree_is_refused_by_every_reader(tmp_path):
    """The evaluation counted a dataset's classes by ``nc`` and the trainer by ``names``: a label of
    class 2 under {"nc": 3, "names": ["a", "b"]} was scored by one and refused by the other."""
    import json

    import pytest

    from edgewise.errors import InvalidInputError
    from edgewise_tools.evaluation.frames import declared_classes
    from edgewise_tools.train.data import dataset_names

    (tmp_path / "dataset.json").write_text(json.dumps({"nc": 3, "names": ["a", "b"]}))
    for read in (declared_classes, dataset_names):
        with pytest.raises(InvalidInputError, match=r"dataset.json: nc 3 but 2 names; make them agree"):
            read(tmp_path)
    (tmp_path / "dataset.json").write_text(json.dumps({"nc": 2, "names": ["a", "b"]}))
    assert declared_classes(tmp_path) == 2 and dataset_names(tmp_path) == ["a", "b"]
