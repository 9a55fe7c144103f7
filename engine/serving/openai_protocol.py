"""The OpenAI wire format: request bodies into engine inputs, responses, stream chunks, errors.

Only what the reference engine can honour is accepted: ``prompt`` (a string, a list of token ids,
or a one-element list of either), ``messages`` (chat, flattened by :func:`chat_prompt`),
``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``presence_penalty``,
``frequency_penalty``, ``seed``, ``stream``,
``stream_options.include_usage``, ``n`` = 1, and vLLM's ``ignore_eos`` extension (benchmark
clients send it to fix output lengths). Anything else that would change the output (``stop``,
``logprobs``, ``n`` > 1, ``best_of``) is refused with a 400 rather than silently ignored.
Error bodies are OpenAI's: ``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from mixdiag.engine.core.request import InvalidRequest, SamplingParams

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
_UNSUPPORTED = ("stop", "logprobs", "top_logprobs", "best_of", "suffix", "echo", "tools", "functions",
                "response_format", "logit_bias")


class ApiError(Exception):
    """An error the client gets as an OpenAI-style JSON body with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class GenerationRequest:
    """A validated completion request: what the engine loop needs plus how to answer."""

    kind: str                       # "completion" | "chat"
    model: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad("request body must be a JSON object")
    return body


def chat_prompt(messages) -> str:
    """A plain chat template: one ``<|role|>`` header per message, then the assistant's header."""
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", "messages")
        if m["role"] not in CHAT_ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {m['role']!r}", "messages")
        content = m.get("content", "")
        if isinstance(content, list):   # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def _prompt_ids(prompt, encode, vocab_size: int) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]   # a batch of one
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < vocab_size for t in prompt):
            raise bad(f"prompt token ids must be in [0, {vocab_size})", "prompt")
        return list(prompt)
    raise bad("'prompt' must be a string or a list of token ids (batches of several prompts are not supported)",
              "prompt")


def parse_request(body: dict, kind: str, *, model_name: str, encode, vocab_size: int,
                  max_model_len: int) -> GenerationRequest:
    """Validate ``body`` of ``/v1/completions`` (``kind="completion"``) or chat; ApiError 400 on bad input."""
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("'model' is required", "model")
    if model != model_name:
        # 400 (not vLLM's 404) so every client-side input mistake is one status; the code says which
        raise ApiError(400, f"The model `{model}` does not exist; this server serves `{model_name}`.",
                       param="model", code="model_not_found")
    for key in _UNSUPPORTED:
        if body.get(key) not in (None, False, [], ""):
            raise bad(f"'{key}' is not supported by the reference engine", key)
    if body.get("n", 1) != 1:
        raise bad("only n = 1 is supported", "n")
    if kind == "chat":
        ids = _prompt_ids(chat_prompt(body.get("messages")), encode, vocab_size)
    else:
        if "prompt" not in body:
            raise bad("'prompt' is required", "prompt")
        ids = _prompt_ids(body["prompt"], encode, vocab_size)
    if not ids:
        raise bad("the prompt is empty", "prompt")
    if len(ids) >= max_model_len:
        raise bad(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                  f"{len(ids)} tokens in the prompt (at least one output token must fit).", "prompt")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = max_model_len - len(ids)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    max_tokens = min(max_tokens, max_model_len - len(ids))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    def opt(key: str, default: float):
        return default if body.get(key) is None else body[key]

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=opt("temperature", 1.0), top_p=opt("top_p", 1.0),
                                presence_penalty=opt("presence_penalty", 0.0),
                                frequency_penalty=opt("frequency_penalty", 0.0),
                                seed=body.get("seed"), ignore_eos=bool(body.get("ignore_eos", False)))
    except InvalidRequest as e:
        param = next((k for k in ("presence_penalty", "frequency_penalty", "temperature", "top_p", "seed")
                      if str(e).startswith(k)), None)
        raise bad(str(e), param) from None
    return GenerationRequest(kind, model, tuple(ids), params, stream, bool(opts.get("include_usage", False)))


# ---- responses -------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(req: GenerationRequest, rid: str, text: str, finish: str, n_out: int) -> dict:
    """A non-streamed ``text_completion`` / ``chat.completion`` body."""
    base = {"id": rid, "created": int(time.time()), "model": req.model,
            "usage": usage(len(req.prompt_ids), n_out)}
    if req.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        return {**base, "object": "chat.completion", "choices": [choice]}
    return {**base, "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def chunk(req: GenerationRequest, rid: str, created: int, text: str | None, finish: str | None,
          *, first: bool = False) -> dict:
    """One stream chunk; ``text`` None with ``first`` is chat's opening role delta."""
    if req.kind == "chat":
        delta: dict = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [choice]}
    return {"id": rid, "object": "text_completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}


def usage_chunk(req: GenerationRequest, rid: str, created: int, n_out: int) -> dict:
    """The last chunk before ``[DONE]`` when ``stream_options.include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [],
            "usage": usage(len(req.prompt_ids), n_out)}


def sse(obj) -> bytes:
    """One server-sent event carrying ``obj`` as JSON (or the literal ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
