"""BurstGPT CSV (Wang et al., "BurstGPT: A Real-world Workload Dataset to Optimize LLM
Serving Systems", github.com/HPMLL/BurstGPT):
``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``, timestamps in
seconds from the start of the log. Later releases add session columns; a column named
``Session ID`` / ``Conversation ID`` (and ``Turn``) is read when present.

Rows with 0 response tokens are failed requests in BurstGPT (its README says so); a
replay cannot ask for 0 output tokens, so they are dropped and counted in the notes.
"""
from __future__ import annotations

from dataclasses import replace

from tuner.traffic._rows import BadRows
from tuner.traffic._table import read_csv, to_workload
from tuner.traffic.workload import Workload


def read(path: str, *, skip_bad: bool = False, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    table = read_csv(path, bad)
    session = next((n for n in ("Session ID", "Conversation ID", "session_id", "conversation_id")
                    if table.column(n) is not None), None)
    turn = "Turn" if session and table.column("Turn") is not None else None
    w = to_workload(
        path, table, bad,
        arrival="Timestamp", prompt="Request tokens", output="Response tokens",
        session=session, turn=turn, fmt="burstgpt",
        hint="a BurstGPT trace has Timestamp,Model,Request tokens,Response tokens,...; "
        "for other columns use --format generic --map",
    )
    failed = w.output_tokens == 0
    if failed.any() and not failed.all():
        kept = w.take((~failed).nonzero()[0])
        note = f"dropped {int(failed.sum())} failed requests (Response tokens 0)"
        return replace(kept, notes=w.notes + (note,))
    return w
