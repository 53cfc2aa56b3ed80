"""The workload model: requests with arrival time, prompt and output lengths, and
optional prefix structure. Columns are numpy arrays so that a million-row trace
loads and simulates quickly; :class:`Request` is the one-row view.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.core.errors import InputError


@dataclass(frozen=True, slots=True)
class Request:
    """One logged request. ``hash_ids`` name the prompt's prefix blocks of
    ``Workload.block_tokens`` tokens each (two requests with the same leading ids share
    that many leading prompt tokens)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    session: str | None = None
    turn: int = 0
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests sorted by arrival time (seconds from the first arrival).

    ``session`` holds a conversation id per request (or ``None``); ``turn`` its
    position in the conversation. ``hash_ids`` is ``None`` when the source has no
    prefix structure. ``estimated_tokens`` is True when token counts were estimated
    from text without the model's tokenizer.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: Sequence[str | None] | None = None
    turn: np.ndarray | None = None
    hash_ids: Sequence[tuple[int, ...]] | None = None
    block_tokens: int = 512
    source: str = "unknown"
    estimated_tokens: bool = False
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        object.__setattr__(self, "arrival_s", np.asarray(self.arrival_s, dtype=np.float64))
        object.__setattr__(self, "prompt_tokens", np.asarray(self.prompt_tokens, dtype=np.int64))
        object.__setattr__(self, "output_tokens", np.asarray(self.output_tokens, dtype=np.int64))
        if self.turn is not None:
            object.__setattr__(self, "turn", np.asarray(self.turn, dtype=np.int64))
        for name in ("prompt_tokens", "output_tokens", "session", "turn", "hash_ids"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise InputError(
                    f"workload column {name} has {len(col)} rows, arrival_s has {n}",
                    path=self.source,
                )
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise InputError("workload arrivals are not sorted by time", path=self.source)

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_requests(
        cls, requests: Sequence[Request], *, block_tokens: int = 512, source: str = "requests",
        estimated_tokens: bool = False,
    ) -> Workload:
        """Build from :class:`Request` rows (sorted by arrival; times shifted to start at 0)."""
        reqs = sorted(requests, key=lambda r: r.arrival_s)
        t0 = reqs[0].arrival_s if reqs else 0.0
        has_session = any(r.session is not None for r in reqs)
        has_hash = any(r.hash_ids for r in reqs)
        return cls(
            arrival_s=np.array([r.arrival_s - t0 for r in reqs], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
            session=[r.session for r in reqs] if has_session else None,
            turn=np.array([r.turn for r in reqs], dtype=np.int64) if has_session else None,
            hash_ids=[tuple(r.hash_ids) for r in reqs] if has_hash else None,
            block_tokens=block_tokens,
            source=source,
            estimated_tokens=estimated_tokens,
        )

    def take(self, index: np.ndarray | Sequence[int] | slice, *, rebase: bool = True) -> Workload:
        """A sub-workload of the given rows (kept in arrival order, times rebased to 0)."""
        idx = np.arange(len(self))[index] if isinstance(index, slice) else np.sort(np.asarray(index, dtype=np.int64))
        arr = self.arrival_s[idx]
        if rebase and len(arr):
            arr = arr - arr[0]
        pick = lambda col: None if col is None else [col[i] for i in idx]  # noqa: E731
        return Workload(
            arrival_s=arr,
            prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx],
            session=pick(self.session),
            turn=None if self.turn is None else self.turn[idx],
            hash_ids=pick(self.hash_ids),
            block_tokens=self.block_tokens,
            source=self.source,
            estimated_tokens=self.estimated_tokens,
            notes=self.notes,
        )

    def reordered(self, seed: int) -> Workload:
        """Another sample of the same requests: conversations (or single requests) in a
        random order drawn from ``seed``, each conversation's turns kept in order; the
        arrival times stay where they were and are handed out in the new order. A closed
        loop or a trace replay then offers the requests in a different sequence, which is
        what a repeat measurement on new traffic of the same mix sees."""
        n = len(self)
        if n < 2:
            return self
        rng = np.random.default_rng(seed)
        groups: dict[object, list[int]] = {}
        for i in range(n):
            key = ("s", self.session[i]) if self.session is not None and self.session[i] is not None else ("r", i)
            groups.setdefault(key, []).append(i)
        blocks = list(groups.values())
        order = np.concatenate([np.asarray(blocks[j], dtype=np.int64) for j in rng.permutation(len(blocks))])
        pick = lambda col: None if col is None else [col[i] for i in order]  # noqa: E731
        return Workload(
            arrival_s=self.arrival_s.copy(),
            prompt_tokens=self.prompt_tokens[order],
            output_tokens=self.output_tokens[order],
            session=pick(self.session),
            turn=None if self.turn is None else self.turn[order],
            hash_ids=pick(self.hash_ids),
            block_tokens=self.block_tokens,
            source=self.source,
            estimated_tokens=self.estimated_tokens,
            notes=self.notes,
        )

    # -- views ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, i: int) -> Request:
        return Request(
            arrival_s=float(self.arrival_s[i]),
            prompt_tokens=int(self.prompt_tokens[i]),
            output_tokens=int(self.output_tokens[i]),
            session=None if self.session is None else self.session[i],
            turn=0 if self.turn is None else int(self.turn[i]),
            hash_ids=() if self.hash_ids is None else tuple(self.hash_ids[i]),
        )

    def __iter__(self) -> Iterator[Request]:
        for i in range(len(self)):
            yield self[i]

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def fingerprint(self) -> str:
        """Stable 16-hex-digit hash of the content (arrivals to the microsecond,
        lengths, sessions and prefix ids); the source path does not enter it."""
        h = hashlib.sha256()
        h.update(np.round(self.arrival_s * 1e6).astype(np.int64).tobytes())
        h.update(self.prompt_tokens.astype(np.int64).tobytes())
        h.update(self.output_tokens.astype(np.int64).tobytes())
        if self.session is not None:
            h.update("\x1f".join("" if s is None else str(s) for s in self.session).encode())
        if self.hash_ids is not None:
            for ids in self.hash_ids:
                h.update(np.asarray(ids, dtype=np.int64).tobytes())
                h.update(b"|")
            h.update(str(self.block_tokens).encode())
        return h.hexdigest()[:16]
