"""The race's headroom tie-break on a memory-tight card: among ties the repeats cannot tell
apart, lower gpu-memory-utilization is preferred while the ties' KV caches had room, and more
KV memory once one filled at its edge (tuner.study.headroom: the data in benchmarks/kv_error.py)."""
from __future__ import annotations

from tuner.study.headroom import KV_FULL, kv_filled
from tuner.study.race import Candidate, NoiseFloor, decide


def cfg(gmu: float) -> dict:
    return {"gpu_memory_utilization": gmu, "max_num_seqs": 64, "enforce_eager": False}


def test_ties_with_room_go_to_less_memory_and_a_filled_cache_leans_to_more():
    roomy = [Candidate(1, cfg(0.95), [1000.0, 1002.0, 998.0]), Candidate(2, cfg(0.85), [999.0, 1001.0, 997.0])]
    conf = decide(roomy, NoiseFloor(0.01))
    assert conf.winner == 2 and "gpu-memory-utilization 0.85 vs 0.95" in conf.reason
    # the same measurements where the 0.85 cache filled at its edge (preemptions): the 0.95 one is recommended
    tight = [Candidate(1, cfg(0.95), [1000.0, 1002.0, 998.0]), Candidate(2, cfg(0.85), [999.0, 1001.0, 997.0],
                                                                        kv_full=True)]
    conf = decide(tight, NoiseFloor(0.01))
    assert conf.winner == 1 and conf.leader == 1
    # and when the leader is the one with less memory, the tie with more is preferred for its KV room
    tight = [Candidate(1, cfg(0.85), [1002.0, 1003.0, 1000.0], kv_full=True), Candidate(2, cfg(0.95), [999.0, 1001.0, 997.0])]  # noqa: E501
    conf = decide(tight, NoiseFloor(0.01))
    assert conf.winner == 2 and "gpu-memory-utilization 0.95 vs 0.85 (more KV memory" in conf.reason


def test_a_cache_filled_by_preemptions_or_its_peak_usage():
    assert not kv_filled({}) and not kv_filled(None)
    assert not kv_filled({"kv_cache_usage_max": KV_FULL - 0.01, "num_preemptions": 0})
    assert kv_filled({"kv_cache_usage_max": KV_FULL}) and kv_filled({"kv_cache_usage_max": 0.3, "num_preemptions": 2})


def test_the_headroom_order_and_the_report_columns_come_from_the_knob_rows(monkeypatch):
    import dataclasses

    from tuner.core import knobs
    from tuner.report import html
    from tuner.study import headroom

    rows = {k.name: k for k in knobs.KNOBS}
    # the race weighs the rows that say how, in the rows' order, an unset knob as its row says
    assert headroom.HEADROOM_KNOBS == ("gpu_memory_utilization", "max_num_seqs", "enforce_eager", "api_server_count")
    assert headroom.headroom_key({"gpu_memory_utilization": 0.9, "max_num_seqs": 64, "enforce_eager": True,
                                  "api_server_count": 2}) == (0.9, 64, 1, 2)
    assert headroom.headroom_key({}, tight=True) == (-1.0, 1e9, 0, 1)
    # a row given a headroom value is weighed, after those before it in the table
    extra = dataclasses.replace(rows["long_prefill_token_threshold"], headroom=0.0)
    monkeypatch.setattr(headroom, "_HEADROOM_ROWS", (*headroom._HEADROOM_ROWS[:2], extra, *headroom._HEADROOM_ROWS[2:]))
    assert headroom.headroom_key({"long_prefill_token_threshold": 512}) == (1.0, 1e9, 512, 0, 1)
    # every knob has a column in the report's table, the two the table once left out too
    assert html.TOP_COLUMNS[-len(knobs.KNOBS):] == tuple(rows)
    assert {"long_prefill_token_threshold", "api_server_count"} <= set(html.TOP_COLUMNS)
