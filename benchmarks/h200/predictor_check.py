"""The simulator as predictor, against a real ``tuner search --backend vllm`` study on an H200.

``search-run/trials.jsonl`` is a real 16-trial study (vLLM 0.26.0 on one H200, the
Qwen2.5-7B shape with dummy weights, 400 requests of the built-in mix, P95 TTFT <= 1 s;
``benchmarks/h200/search.sh``, three device calls). This script re-predicts every measured
configuration with the simulator as the code stands (shipped H200 profile) and prints, side
by side: the predicted edge load and tokens/s against what the real goodput search measured,
and the GPU seconds the study spent against the same 16 trials run naively (each launched,
every replay to its end from the most users the configuration holds; startup = the real
median, replay seconds = the simulator's, which matched these measurements within the
errors printed).

Run: ``python benchmarks/h200/predictor_check.py``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRIALS = HERE / "search-run" / "trials.jsonl"
SPACE = HERE / "search-space.yaml"


def load_run(path: Path = TRIALS) -> tuple[dict, list[dict]]:
    """The study's facts and its trials, each with its ``record`` (:class:`TrialRecord`)."""
    from tuner.study.record import TrialRecord

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows[1:]:
        r["record"] = TrialRecord.from_attrs(r["user_attrs"], trial=r["number"])
    return rows[0]["meta"], rows[1:]


def measured(rows: list[dict]) -> list[dict]:
    """Trials that launched and measured (no pruned trial, no reuse of an earlier one)."""
    return [r for r in rows if r["state"] == "COMPLETE" and not r["record"].is_repeat and r["record"].loads]


def edge(rec) -> float:
    return max(p.level for p in rec.loads if p.passed)


def scenario():
    from tuner.search import build_workload, num_heads
    from tuner.space import load_space

    space = load_space(str(SPACE))
    space = space.bind(space.deployment, num_heads(space.deployment))
    return space, build_workload(space.workload)


def compare(rows: list[dict]) -> list[dict]:
    """Per measured trial: today's prediction vs the real measurement."""
    from tuner.search.prediction import Predictor

    space, workload = scenario()
    predictor = Predictor(space.deployment, workload, space.workload.target_ttft_s)
    out = []
    for r in measured(rows):
        rec = r["record"]
        pred = predictor.predict(rec.config)
        first = rec.loads[0]
        fails = [p.level for p in rec.loads if not p.passed and p.level is not None]
        out.append({"trial": r["number"], "config": rec.config.to_dict(), "pred_level": pred.level,
                    "pred_tokens_per_s": pred.tokens_per_s, "level": edge(rec), "tokens_per_s": r["value"],
                    "failed_level": min((f for f in fails if f > edge(rec)), default=None),
                    "first_level": first.level, "first_passed": first.passed, "gpu_s": rec.gpu_s,
                    "startup_s": rec.run.startup_s})
    return out


def naive_gpu_s(rows: list[dict], startup_s: float) -> float:
    """The same trials run naively: ``startup_s`` (the real median start) each, plus the
    simulator's seconds of a goodput search from the top with every replay run to its end."""
    from tuner.backends.sim import SimBackend
    from tuner.search import evaluate_config

    space, workload = scenario()
    total = 0.0
    for r in rows:
        ev = evaluate_config(SimBackend(), space.deployment, r["record"].config,
                             workload, space.workload.target_ttft_s, precheck=False, early_stop=False)
        total += startup_s + sum(p.duration_s for p in ev.record.loads)
    return total


def main() -> None:
    meta, rows = load_run()
    print(f"real study: {meta['machine']}; {meta['when']}")
    print(f"{len(rows)} trials: {len(measured(rows))} launched and measured, "
          f"{sum(r['state'] == 'PRUNED' for r in rows)} pruned by the predictor, "
          f"{sum(r['record'].is_repeat for r in rows)} reused (same configuration proposed again)\n")
    rows_cmp = compare(rows)
    print(f"{'trial':>5} {'seqs':>5} {'mbt':>5} {'eager':>5} {'edge: predicted':>16} {'measured':>9} "
          f"{'tok/s: predicted':>17} {'measured':>9} {'error':>7} {'first replay':>13} {'GPU s':>6}")
    for c in rows_cmp:
        cfg = c["config"]
        err = c["pred_tokens_per_s"] / c["tokens_per_s"] - 1
        first = f"{c['first_level']:.0f} {'pass' if c['first_passed'] else 'miss'}"
        print(f"{c['trial']:>5} {cfg['max_num_seqs']:>5} {cfg['max_num_batched_tokens']:>5} {cfg['enforce_eager']!s:>5} "  # noqa: E501
              f"{c['pred_level']:>16.0f} {c['level']:>9.0f} {c['pred_tokens_per_s']:>17,.0f} {c['tokens_per_s']:>9,.0f} "  # noqa: E501
              f"{err:>+7.1%} {first:>13} {c['gpu_s']:>6.0f}")
    errors = [abs(c["pred_tokens_per_s"] / c["tokens_per_s"] - 1) for c in rows_cmp]
    print(f"\npredicted tokens/s at the edge vs measured: mean |error| {statistics.mean(errors):.1%}, "
          f"worst {max(errors):.1%}; the first replay (at the predicted load) passed in "
          f"{sum(c['first_passed'] for c in rows_cmp)}/{len(rows_cmp)}")
    for r in rows:
        if r["state"] == "PRUNED":
            print(f"  pruned trial {r['number']}: {r['record'].pruned_reason}")
    spent = sum(r["record"].gpu_s or 0.0 for r in rows)
    naive = naive_gpu_s(rows, statistics.median(c["startup_s"] for c in rows_cmp))
    print(f"\nGPU seconds: this study {spent:,.0f} s vs the same {len(rows)} trials run naively ~{naive:,.0f} s "
          f"= {spent / naive:.0%}")


if __name__ == "__main__":
    main()
