"""The OpenAI-compatible HTTP server around the reference engine (``mixdiag serve``).

Why Starlette + uvicorn: uvicorn is the server vLLM and SGLang run behind (so graceful shutdown
on SIGTERM, keep-alive and SSE flushing behave as a user's real server does), and Starlette is
the small ASGI toolkit FastAPI sits on. FastAPI's pydantic models would add a validation layer
whose 422 errors are not OpenAI's; the few fields the engine honours are validated by hand in
``openai_protocol.py`` into OpenAI-style 400 bodies. aiohttp would mean a second HTTP stack next
to the httpx client the load generator and the openai SDK already use.

Flow: a handler validates the body, admits the request (429 when ``max_queue`` requests are
already in flight), hands it to :class:`EngineLoop` and awaits its own asyncio queue; the engine
thread steps and pushes tokens. Streams send one SSE chunk per engine step that produced tokens
for the request (so a client's chunk times are the engine's token times plus the network), then
the usage chunk when ``stream_options.include_usage``, then ``data: [DONE]``. A client that goes
away mid-stream cancels its handler, whose ``finally`` aborts the request (its KV blocks are freed
before the next step). SIGTERM: uvicorn stops accepting and open requests get ``drain_timeout_s``
to finish; then each one still open is ended by the server itself - a stream with a final
``data: {"error": ...}`` event and ``data: [DONE]``, a plain request with a 503 - and logged on one
line, before uvicorn's own (later) deadline would cancel the handlers with a traceback each.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
import uuid
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mixdiag.engine.serving import openai_protocol as proto
from mixdiag.engine.serving.engine_loop import EngineLoop
from mixdiag.engine.serving.openai_protocol import ApiError
from mixdiag.errors import UserError

log = logging.getLogger("mixdiag.serve")

# uvicorn's own shutdown deadline is this much later than ours, so the handlers end themselves
# (final event, one log line) and uvicorn never has to cancel them.
_UVICORN_DRAIN_MARGIN_S = 5.0


@dataclass(frozen=True)
class ServerConfig:
    """HTTP-side settings; validated on construction."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "mixdiag-tiny"
    max_queue: int = 256               # requests admitted and unfinished at most; more get 429
    request_timeout_s: float = 600.0   # per request, admission to last token; then 504 / error event
    drain_timeout_s: float = 30.0      # SIGTERM: how long open streams may finish

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in 0..65535, got {self.port}")
        if self.max_queue < 1:
            raise UserError(f"--max-queue must be >= 1, got {self.max_queue}")
        if not self.request_timeout_s > 0:
            raise UserError(f"--request-timeout must be > 0 seconds, got {self.request_timeout_s}")
        if self.drain_timeout_s < 0:
            raise UserError(f"--drain-timeout must be >= 0 seconds, got {self.drain_timeout_s}")
        if not self.model_name:
            raise UserError("--model-name must not be empty")


class ServingState:
    """What the handlers share: the engine loop, tokenizer, metrics registry, admission count."""

    def __init__(self, config: ServerConfig, loop: EngineLoop, tokenizer, registry, *, on_shutdown=()):
        self.config, self.loop, self.tokenizer, self.registry = config, loop, tokenizer, registry
        mc = loop.engine.config.model
        self.vocab_size, self.max_model_len = mc.vocab_size, mc.max_model_len
        # draft verification (greedy match / rejection sampling) does not apply penalties
        self.spec_decode = getattr(loop.engine.config.scheduler, "num_spec_tokens", 0) > 0
        self.active = 0          # admitted and unfinished (only touched on the asyncio thread)
        self.rejected = 0        # 429s
        self.on_shutdown = list(on_shutdown)
        self.started_s = time.time()
        self.open: dict[str, _Open] = {}   # admitted and unfinished, by request id
        self.drain_expired = False

    def retry_after_s(self) -> int:
        """Whole seconds until a slot likely frees: the fewest tokens any open request still has to
        generate times the mean engine step (requests that stop early free it sooner); at least 1."""
        s = self.loop.stats
        step_s = s.step_s_total / s.steps if s.steps else 0.0
        left = min((o.max_tokens - o.n_out for o in self.open.values()), default=0)
        return max(1, math.ceil(left * step_s))

    def begin_drain(self) -> None:
        """Shutdown started: end every request still open ``drain_timeout_s`` from now."""
        asyncio.get_running_loop().call_later(self.config.drain_timeout_s, self._expire_drain)

    def _expire_drain(self) -> None:
        self.drain_expired = True
        msg = f"server shutting down: --drain-timeout {self.config.drain_timeout_s:g} s expired before the request finished"
        for o in self.open.values():
            o.queue.put_nowait(("error", 503, msg))


@dataclass
class _Open:
    """An admitted request as the asyncio side sees it (for drain expiry and Retry-After)."""

    queue: asyncio.Queue
    max_tokens: int
    n_out: int = 0


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _next(q: asyncio.Queue, deadline: float):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    return await asyncio.wait_for(q.get(), remaining)


async def _generate(request: Request, kind: str) -> Response:
    st: ServingState = request.app.state.serving
    cfg = st.config
    try:
        body = proto.parse_json(await request.body())
        g = proto.parse_request(body, kind, model_name=cfg.model_name, encode=st.tokenizer.encode,
                                vocab_size=st.vocab_size, max_model_len=st.max_model_len)
        if st.spec_decode and g.params.penalized:
            raise proto.bad("presence_penalty / frequency_penalty are not supported with speculative decoding "
                            "(this server's scenario sets num_spec_tokens)", "presence_penalty")
    except ApiError as e:
        return _error(e)
    if st.active >= cfg.max_queue:
        st.rejected += 1
        wait = st.retry_after_s()
        resp = _error(ApiError(429, f"the server already holds {st.active} requests (--max-queue "
                                    f"{cfg.max_queue}); retry in {wait} s", type="rate_limit_exceeded",
                               code="rate_limit_exceeded"))
        resp.headers["Retry-After"] = str(wait)
        return resp
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    q: asyncio.Queue = asyncio.Queue()
    deadline = time.monotonic() + cfg.request_timeout_s
    st.active += 1
    st.open[rid] = _Open(q, g.params.max_tokens)
    finished = False

    def release() -> None:
        nonlocal finished
        if not finished:
            st.loop.abort(rid)   # a no-op once the loop delivered the last token
        finished = True
        st.active -= 1
        st.open.pop(rid, None)

    st.loop.submit(rid, g.prompt_ids, g.params, asyncio.get_running_loop(), q)
    try:
        first = await _next(q, deadline)
    except asyncio.TimeoutError:
        release()
        return _error(ApiError(504, f"request not admitted within {cfg.request_timeout_s:g} s", type="timeout"))
    except asyncio.CancelledError:
        release()
        raise
    if first[0] == "error":
        finished = first[1] != 503   # a drain expiry: the engine still holds the request
        release()
        _log_cut(st, rid, 0, first)
        return _error(ApiError(first[1], first[2], type="invalid_request_error" if first[1] < 500 else "server_error"))
    if g.stream:
        return StreamingResponse(_stream(st, g, rid, q, deadline, release), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        dec = st.tokenizer.decoder()
        n_out, finish = 0, None
        while finish is None:
            item = await _next(q, deadline)
            if item[0] == "error":
                _log_cut(st, rid, n_out, item)
                return _error(ApiError(item[1], item[2], type="server_error"))
            _, ids, _t, finish = item
            n_out += len(ids)
            st.open[rid].n_out = n_out
            dec.push(ids, final=finish is not None)
        finished = True
        return JSONResponse(proto.full_response(g, rid, dec.text, finish, n_out))
    except asyncio.TimeoutError:
        return _error(ApiError(504, f"request timed out after {cfg.request_timeout_s:g} s", type="timeout"))
    finally:
        release()


async def _stream(st: ServingState, g, rid: str, q: asyncio.Queue, deadline: float, release):
    created = int(time.time())
    dec = st.tokenizer.decoder()
    n_out = 0
    try:
        if g.kind == "chat":
            yield proto.sse(proto.chunk(g, rid, created, None, None, first=True))
        finish = None
        while finish is None:
            try:
                item = await _next(q, deadline)
            except asyncio.TimeoutError:
                yield proto.sse(ApiError(504, f"request timed out after {st.config.request_timeout_s:g} s",
                                         type="timeout").body())
                yield proto.sse("[DONE]")
                return
            if item[0] == "error":
                _log_cut(st, rid, n_out, item)
                yield proto.sse(ApiError(item[1], item[2], type="server_error").body())
                yield proto.sse("[DONE]")
                return
            _, ids, _t, finish = item
            n_out += len(ids)
            st.open[rid].n_out = n_out
            text = dec.push(ids, final=finish is not None)
            yield proto.sse(proto.chunk(g, rid, created, text, finish))
        if g.include_usage:
            yield proto.sse(proto.usage_chunk(g, rid, created, n_out))
        yield proto.sse("[DONE]")
    finally:
        release()


def _log_cut(st: ServingState, rid: str, n_out: int, item) -> None:
    """One line for a request the drain deadline ended (engine failures are logged by the loop)."""
    if item[1] == 503 and st.drain_expired:
        log.warning("mixdiag serve: %s cut by --drain-timeout %g s after %d tokens", rid,
                    st.config.drain_timeout_s, n_out)


async def completions(request: Request) -> Response:
    return await _generate(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _generate(request, "chat")


async def models(request: Request) -> Response:
    st: ServingState = request.app.state.serving
    return JSONResponse({"object": "list", "data": [_card(st)]})


def _card(st: ServingState) -> dict:
    return {"id": st.config.model_name, "object": "model", "created": int(st.started_s), "owned_by": "mixdiag",
            "root": st.config.model_name, "max_model_len": st.max_model_len}


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}``: the model card, or an OpenAI 404 for any other id."""
    st: ServingState = request.app.state.serving
    mid = request.path_params["model_id"]
    if mid != st.config.model_name:
        return _error(ApiError(404, f"The model `{mid}` does not exist; this server serves `{st.config.model_name}`.",
                               param="model", code="model_not_found"))
    return JSONResponse(_card(st))


async def health(request: Request) -> Response:
    st: ServingState = request.app.state.serving
    s = st.loop.stats
    body = {"status": "ok" if st.loop.healthy else "engine_failed", "in_flight": st.active,
            "rejected_429": st.rejected, "steps": s.steps, "added": s.added, "finished": s.finished,
            "aborted": s.aborted, "kv_free_blocks": s.kv_free_blocks, "kv_total_blocks": s.kv_total_blocks,
            "last_error": s.last_error}
    return JSONResponse(body, status_code=200 if st.loop.healthy else 503)


async def metrics(request: Request) -> Response:
    st: ServingState = request.app.state.serving
    return Response(generate_latest(st.registry), media_type=CONTENT_TYPE_LATEST)


async def _not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    return _error(ApiError(status, f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
                           type="invalid_request_error" if status < 500 else "server_error"))


def create_app(state: ServingState) -> Starlette:
    """The ASGI app; the engine thread starts with the app's lifespan and stops after draining."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.loop.start()
        try:
            yield
        finally:
            state.loop.stop()
            for fn in state.on_shutdown:
                fn()

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/v1/models/{model_id:path}", model, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: _not_found, 405: _not_found})
    app.state.serving = state
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 = any free port), so the URL is known before uvicorn starts."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_uvicorn(app, config: ServerConfig):
    """A uvicorn Server whose SIGTERM/SIGINT drain open streams for ``drain_timeout_s``, then end them."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.serving.begin_drain()
            await super().shutdown(sockets)

    ucfg = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                          timeout_graceful_shutdown=config.drain_timeout_s + _UVICORN_DRAIN_MARGIN_S,
                          timeout_keep_alive=30)
    return DrainingServer(ucfg)
