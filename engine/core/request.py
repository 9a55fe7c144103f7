"""A request's lifetime state: prompt, outputs, how many tokens are computed, sampling parameters.

``num_computed_tokens`` counts tokens whose K/V are in the cache. A request needs
``num_tokens - num_computed_tokens`` more tokens computed (its whole prompt at first, then one per
decode step, more after a preemption by recompute); the scheduler decides how many per step.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from mixdiag.errors import UserError


class InvalidRequest(UserError, ValueError):
    """A request the engine refuses (empty prompt, too long, bad sampling parameters)."""


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"   # EOS
    FINISHED_LENGTH = "finished_length"     # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; else temperature + top-p sampling from a per-request seeded generator.

    ``presence_penalty``/``frequency_penalty`` (OpenAI's, in [-2, 2]) lower the logits of tokens the
    request already generated: ``logits -= presence * [count > 0] + frequency * count``.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = False      # SGLang's mix_with_running refuses batches with logprob requests
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise InvalidRequest(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _finite(v) or not -2.0 <= v <= 2.0:
                raise InvalidRequest(f"{name} must be a number in [-2, 2], got {v!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidRequest(f"seed must be an integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class Request:
    """One generation request inside the engine."""

    __slots__ = ("request_id", "prompt_token_ids", "params", "arrival_s", "output_token_ids", "all_token_ids",
                 "num_computed_tokens", "status", "spec_token_ids", "has_input_embeds", "beam_group",
                 "num_preemptions", "first_token_s", "sampling_seed")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_s: float,
                 sampling_seed: int = 0, has_input_embeds: bool = False, beam_group: str | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.arrival_s = arrival_s
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = Status.WAITING
        self.spec_token_ids: list[int] = []   # draft tokens to verify next step (a drafter fills them)
        self.has_input_embeds = has_input_embeds
        self.beam_group = beam_group
        self.num_preemptions = 0
        self.first_token_s: float | None = None
        self.sampling_seed = sampling_seed

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens (with drafts) still to run through the model before the next sample."""
        return self.num_tokens + len(self.spec_token_ids) - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """Past its prefill: only the last sampled token (and drafts) remain to compute."""
        return self.num_output_tokens > 0 and self.num_computed_tokens >= self.num_tokens - 1

    def append_output(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.all_token_ids.append(token)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")
