"""A stand-in engine behind tuner.sim.server.SimServer, for tests that need a real server
process without the simulator's memory planner and scheduler.

FCFS, at most ``max_seqs`` running; a step lasts ``step_s`` plus ``prefill_s_per_token``
per prompt token admitted in it; a request's first token comes in the step that admits
it, then one token per step. Run: ``python stub_server.py --port N [--step-s 0.005]``.
"""
from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace


class StubEngine:
    def __init__(self, step_s: float = 0.005, max_seqs: int = 256, prefill_s_per_token: float = 0.0) -> None:
        self.step_s = step_s
        self.max_seqs = max_seqs
        self.prefill_s_per_token = prefill_s_per_token
        self.waiting: list[list] = []   # [rid, prompt, output, emitted]
        self.running: list[list] = []
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.added: list[tuple] = []

    def add_request(self, req_id, prompt_tokens, output_tokens, hash_ids=(), block_tokens=512):
        self.added.append((req_id, prompt_tokens, output_tokens, tuple(hash_ids), block_tokens))
        self.waiting.append([req_id, prompt_tokens, output_tokens, 0])

    def abort(self, req_id):
        self.waiting = [r for r in self.waiting if r[0] != req_id]
        self.running = [r for r in self.running if r[0] != req_id]

    def has_work(self):
        return bool(self.waiting or self.running)

    def step(self):
        prefill = 0
        while self.waiting and len(self.running) < self.max_seqs:
            req = self.waiting.pop(0)
            prefill += req[1]
            self.prompt_tokens += req[1]
            self.running.append(req)
        new, finished = {}, []
        for req in self.running:
            req[3] += 1
            new[req[0]] = 1
            if req[3] >= req[2]:
                finished.append(req[0])
        self.generation_tokens += len(new)
        self.running = [r for r in self.running if r[3] < r[2]]
        return SimpleNamespace(duration_s=self.step_s + prefill * self.prefill_s_per_token,
                               new_tokens=new, finished=finished, num_preempted=0)

    def stats(self):
        return {"num_running": len(self.running), "num_waiting": len(self.waiting),
                "kv_cache_usage": len(self.running) / self.max_seqs, "num_preemptions": 0,
                "prefix_cache_queries": self.prompt_tokens, "prefix_cache_hits": 0,
                "prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens}


def main(argv=None) -> int:
    from aiohttp import web

    from tuner.sim.server import SimServer

    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="stub-model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-s", type=float, default=0.005)
    p.add_argument("--max-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    args, _unknown = p.parse_known_args(argv)
    engine = StubEngine(args.step_s, args.max_seqs)
    server = SimServer(engine, model_name=args.model, max_model_len=args.max_model_len,
                       num_gpu_blocks=1000)
    print("INFO GPU KV cache size: 16,000 tokens, Maximum concurrency for 4,096 tokens per request: 3.91x",
          flush=True)
    web.run_app(server.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
