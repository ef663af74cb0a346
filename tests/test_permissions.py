"""Published folders and files follow the user's umask (issue 22, point 3): ``tempfile``
alone would leave every result, report and partition folder 0700 and files 0600."""

import os
import stat

import pytest

from fedshift.data.store import atomic_dir, atomic_write_text, current_umask


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
        return mask

    yield set_
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, dir_mode, file_mode", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664),
                                                       (0o077, 0o700, 0o600)])
def test_published_modes_follow_umask(tmp_path, umask, mask, dir_mode, file_mode):
    umask(mask)
    assert current_umask() == mask
    target = tmp_path / "results" / "run"
    with atomic_dir(target) as tmp:
        (tmp / "metrics.json").write_text("{}")
    assert _mode(target) == dir_mode
    assert _mode(target / "metrics.json") == file_mode
    csv = tmp_path / "runs.csv"
    atomic_write_text(csv, "a,b\n")
    assert _mode(csv) == file_mode


def test_republish_keeps_group_readable(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "report"
    for text in ("first", "second"):
        with atomic_dir(target) as tmp:
            (tmp / "report.md").write_text(text)
    assert (target / "report.md").read_text() == "second"
    assert _mode(target) == 0o755
