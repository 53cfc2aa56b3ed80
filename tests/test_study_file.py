"""A study's SQLite file never vanishes silently (tuner.study.sqlite_file): an empty or
foreign file, or a missing one with its log or a saved copy beside it, is named and never
made a new study; a file deleted or replaced mid-study stops the search, with the study the
process still held saved beside it; a damaged file and one at the file-size limit are named."""
from __future__ import annotations

import sqlite3

import pytest
from fakes import FakeBackend, small_workload

from tuner.core.errors import EnvironmentFault
from tuner.runtime.progress import Observer
from tuner.search import run_search
from tuner.serving.config import Deployment
from tuner.space import parse_space
from tuner.study import open_study
from tuner.study.sqlite_file import StudyFileFault, file_fault

SPACE = """\
name: f
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  max_num_seqs: {choices: [16, 32, 64, 128]}
  max_model_len: {choices: [2048, 4096]}
layouts: [tp1x1]
"""


def space():
    return parse_space(SPACE, path="f.yaml").bind(Deployment(gpu_count=1), num_heads=28)


@pytest.mark.parametrize("content, words", [(b"", "is empty (0 bytes)"), (b"PK\x03\x04 a zip" * 20, "not an SQLite")])
def test_an_empty_or_foreign_study_file_is_named_and_left_as_it_is(tmp_path, content, words):
    db = tmp_path / "s.db"
    db.write_bytes(content)
    with pytest.raises(StudyFileFault) as err:
        open_study("s", f"sqlite:///{db}")
    assert words in str(err.value) and str(db) in str(err.value) and err.value.exit_code == 2
    assert db.read_bytes() == content  # never turned into a new study


def test_a_missing_study_with_its_write_ahead_log_left_is_named(tmp_path):
    (tmp_path / "s.db-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\0" * 60)
    with pytest.raises(StudyFileFault) as err:
        open_study("s", f"sqlite:///{tmp_path}/s.db")
    assert "write-ahead log" in str(err.value) and not (tmp_path / "s.db").exists()


class Deleting(Observer):
    """Deletes (or replaces) the study file once ``after`` trials are finished."""

    def __init__(self, db, after: int, replace: bool = False) -> None:
        self.db, self.after, self.replace, self.done = db, after, replace, 0

    def on_trial(self, trial, best, finished) -> None:
        self.done += 1
        if self.done == self.after:
            self.db.unlink()
            if self.replace:
                sqlite3.connect(self.db).execute("CREATE TABLE other (x)").connection.commit()


@pytest.mark.parametrize("replace", [False, True], ids=["deleted", "replaced"])
def test_a_study_file_deleted_mid_study_stops_the_run_and_the_study_is_saved(tmp_path, replace):
    db = tmp_path / "s.db"
    with pytest.raises(StudyFileFault) as err:
        run_search(space(), backend=FakeBackend(), workload=small_workload(), budget=8, sampler="grid",
                   storage=f"sqlite:///{db}", study="s", confirm=0, precheck=False, observer=Deleting(db, 3, replace))
    text = str(err.value)
    assert ("replaced by another file" if replace else "was deleted") in text and "\n" not in text
    copies = sorted(tmp_path.glob("s.recovered-*.db"))
    assert len(copies) == 1 and f"mv {copies[0]} {db}" in text
    saved = open_study("s", f"sqlite:///{copies[0]}")
    assert sum(t.state.name == "COMPLETE" for t in saved.trials) >= 3  # what the run had finished
    if not replace:  # the next run names the copy instead of starting anew
        with pytest.raises(StudyFileFault) as again:
            open_study("s", f"sqlite:///{db}")
        assert str(copies[0]) in str(again.value)
        copies[0].rename(db)
        assert sum(t.state.name == "COMPLETE" for t in open_study("s", f"sqlite:///{db}").trials) >= 3


def test_a_damaged_file_and_one_at_the_file_size_limit_are_named(tmp_path, monkeypatch):
    import resource

    db = tmp_path / "s.db"
    db.write_bytes(b"SQLite format 3\x00" + b"\0" * 200_000)
    url = f"sqlite:///{db}"
    assert file_fault("database disk image is malformed", url).kind == "corrupt"
    assert file_fault("disk i/o error", url) is None  # no file size limit here: not EFBIG
    monkeypatch.setattr(resource, "getrlimit", lambda what: (200 * 1024, resource.RLIM_INFINITY))
    fault = file_fault("disk i/o error", url)
    assert isinstance(fault, EnvironmentFault) and fault.kind == "file_too_large"
    assert "ulimit -f: 200 KiB" in str(fault) and str(db) in str(fault)


def test_doctor_names_an_empty_study_file(tmp_path):
    from tuner.ops.doctor import check_sqlite

    (tmp_path / "s.db").write_bytes(b"")
    health = check_sqlite(tmp_path / "s.db")
    assert not health.ok and any("is empty (0 bytes)" in p for p in health.problems)
