"""Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

Published by Microsoft with Splitwise (Patel et al., ISCA 2024) in
github.com/Azure/AzurePublicDataset (``data/AzureLLMInferenceTrace_{code,conv}.csv``):
wall-clock timestamps with 7 fractional digits and no zone, prompt and output token
counts. No prompt text, no sessions, no prefix structure.
"""
from __future__ import annotations

from tuner.traffic._rows import BadRows
from tuner.traffic._table import read_csv, to_workload
from tuner.traffic.workload import Workload


def read(path: str, *, skip_bad: bool = False, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    table = read_csv(path, bad, date_column="TIMESTAMP")
    return to_workload(
        path, table, bad,
        arrival="TIMESTAMP", prompt="ContextTokens", output="GeneratedTokens",
        fmt="azure", hint="an Azure trace has TIMESTAMP,ContextTokens,GeneratedTokens; "
        "for other columns use --format generic --map",
    )
