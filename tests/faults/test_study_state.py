"""A study's identity and state survive what users do to it: an edited space under the
same name, names that would leave studies/, two processes creating one file, a
read-only study (real tuner processes, tests/faults/scenarios.py)."""
from __future__ import annotations

import pytest
import scenarios as sc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_an_edited_space_under_the_same_name_is_refused_saying_what_differs(tmp_path):
    o = sc.space_changed(tmp_path)
    code, scode, rcode, acode = o.details["codes"]
    assert scode == 0, o.details["same"]               # the same content in another file resumes
    assert rcode == 2 and sc.one_line(o.details["stderr"]), o.details["stderr"]
    assert "max_num_seqs choices [16, 64] -> [16, 32, 64]" in o.details["stderr"]
    ccode, cerr = o.details["choices"]
    # other choices of a searched knob cannot join the study even with --resume-anyway: one line
    assert ccode == 2 and "max_num_seqs" in cerr and "holds" in cerr, cerr
    assert acode == 0, o.details["anyway"]            # a fixed value's edit goes on with --resume-anyway
    assert o.ok, o


def test_study_names_are_checked_and_never_write_outside_studies(tmp_path):
    o = sc.study_names(tmp_path)
    assert o.details["written"] == [], o.details["written"]
    for code, err in o.details["results"].values():
        assert code == 2 and sc.one_line(err) and "study name" in err, err
    assert o.ok, o


def test_two_processes_creating_one_sqlite_file_at_once_both_open_it(tmp_path):
    o = sc.shared_sqlite_creation(tmp_path)
    assert o.details["bad"] == [], o.details["bad"]
    assert o.ok, o


def test_a_read_only_study_opens_for_reading_and_only_writes_are_refused(tmp_path):
    o = sc.read_only_study(tmp_path)
    assert o.details["shown"][0] == 0, o.details["shown"]
    assert o.details["plan"][0] == 0 and any("read-only" in n for n in o.details["notes"]), o.details["plan"]
    assert o.details["report"][0] == 0, o.details["report"]
    code, _, err = o.details["search"]
    assert code == 2 and sc.one_line(err) and "read-only" in err, err
    assert o.details["same"] and o.ok, o
