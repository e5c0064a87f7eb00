"""Throughput of one decoding call: what ``qkv generate``/``translate --verbose`` print."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Counts and wall-clock times (seconds, ``time.perf_counter``) of one decoding call.

    ``items``: prompts or sentences decoded; ``new_tokens``: tokens produced over all rows
    (stop tokens included); ``seconds``: the whole call; ``first_token_seconds``: from the
    start to the first new token (the prompt's "prefill"), ``None`` where not measured.
    """

    items: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    first_token_seconds: float | None = None
    _start: float = field(default_factory=time.perf_counter, repr=False)

    def first_token(self) -> None:
        """Mark the first new token (once)."""
        if self.first_token_seconds is None:
            self.first_token_seconds = time.perf_counter() - self._start

    def stop(self) -> DecodeStats:
        """Mark the end of the call; returns ``self``."""
        self.seconds = time.perf_counter() - self._start
        return self

    def summary(self, unit: str = "tokens") -> str:
        """One line, e.g. ``128 new tokens in 2.71 s: 47.2 tokens/s (first after 0.05 s, then
        47.9 tokens/s)``; ``unit="sentences"`` leads with items per second."""
        rate = lambda n, s: n / s if s > 0 else float("inf")  # noqa: E731
        if unit == "sentences":
            return (
                f"{self.items} sentences in {self.seconds:.2f} s: "
                f"{rate(self.items, self.seconds):.1f} sentences/s, "
                f"{rate(self.new_tokens, self.seconds):.0f} output tokens/s"
            )
        line = (
            f"{self.new_tokens} new tokens in {self.seconds:.2f} s: "
            f"{rate(self.new_tokens, self.seconds):.1f} tokens/s"
        )
        first = self.first_token_seconds
        if first is not None and self.new_tokens > self.items:
            after = rate(self.new_tokens - self.items, self.seconds - first)
            line += f" (first after {first:.2f} s, then {after:.1f} tokens/s)"
        return line
