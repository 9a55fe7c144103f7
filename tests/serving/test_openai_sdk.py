"""The official openai SDK against `mixdiag serve`: streamed = non-streamed, usage, SSE framing, errors."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.serving.conftest import start
from helpers.polling import wait_until as _wait

MODEL = "mixdiag-tiny"


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.mark.parametrize("prompt", ["Hello, world!", "The time per output token spiked"])
def test_completion_streamed_text_equals_non_streamed(server, prompt):
    c = client(server)
    full = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == full.choices[0].finish_reason


def test_chat_streamed_equals_non_streamed_concurrently(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Summarise the document."}]

    def one(stream: bool) -> str:
        if stream:
            return "".join(ch.choices[0].delta.content or "" for ch in
                           c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                                     stream=True) if ch.choices)
        return c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0).choices[0].message.content

    with ThreadPoolExecutor(6) as ex:
        outs = list(ex.map(one, [True, False] * 3))
    assert len(set(outs)) == 1


def test_usage_counts(server):
    from mixdiag.engine.serving.tokenizer import TextTokenizer

    prompt = "Prometheus scrapes the metrics endpoint"
    r = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=9, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(TextTokenizer().encode(prompt))
    assert r.usage.completion_tokens == 9 and r.usage.total_tokens == r.usage.prompt_tokens + 9
    assert r.choices[0].finish_reason == "length"


def test_sse_framing(server):
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1])
    payloads = [e[len("data: "):] for e in events[:-1]]
    assert payloads[-1] == "[DONE]"
    docs = [json.loads(p) for p in payloads[:-1]]
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 6
    token_chunks = [d for d in docs if d["choices"]]
    assert len(token_chunks) == 6 and token_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert {d["id"] for d in docs} == {docs[0]["id"]}


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    ({"model": "gpt-4", "prompt": "hi", "max_tokens": 4}, "model"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"model": MODEL, "prompt": list(range(2, 600)), "max_tokens": 4}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "stop": ["\n"]}, "stop"),
])
def test_bad_input_gets_openai_400(server, body, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + "/v1/completions", timeout=10, headers={"content-type": "application/json"}, **kw)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param


def test_sdk_raises_bad_request_for_unknown_model(server):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="nope", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"


def test_sdk_retrieves_the_model_and_gets_404_for_others(server):
    c = client(server)
    m = c.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and e.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("role, status", [("wizard", 400), ("", 400), ("User", 400), ("system", 200),
                                          ("developer", 200), ("tool", 200), ("assistant", 200)])
def test_chat_roles_are_validated(server, role, status):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": role, "content": "hi"},
                                                          {"role": "user", "content": "go on"}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    if status == 400:
        err = r.json()["error"]
        assert err["param"] == "messages" and "messages[0].role" in err["message"]


def test_models_health_metrics(server):
    m = client(server).models.list()
    assert [x.id for x in m.data] == [MODEL]
    assert server.health()["status"] == "ok"
    text = httpx.get(server.url + "/metrics", timeout=5).text
    assert "mixdiag_engine_steps_total" in text



def test_queue_full_gets_429_json(tmp_path):
    run = start(tmp_path, max_queue=1)
    try:
        run.state.loop.call(lambda engine: time.sleep(1.5))   # hold the engine so the first stays in flight
        body = {"model": MODEL, "prompt": [3] * 8, "max_tokens": 8, "temperature": 0}
        with ThreadPoolExecutor(1) as ex:
            first = ex.submit(httpx.post, run.url + "/v1/completions", json=body, timeout=30)
            assert _wait(lambda: run.health()["in_flight"] == 1)
            second = httpx.post(run.url + "/v1/completions", json=body, timeout=10)
            assert first.result().status_code == 200
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "rate_limit_exceeded"
        # whole seconds (RFC 9110 delay-seconds), at least 1: when the one open request will be done
        assert int(second.headers["Retry-After"]) >= 1
        assert run.health()["rejected_429"] == 1
    finally:
        run.stop()


def test_disconnect_frees_kv_blocks(server):
    total = server.health()["kv_total_blocks"]
    body = {"model": MODEL, "prompt": [4] * 100, "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    aborted0 = server.health()["aborted"]
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert server.health()["kv_free_blocks"] < total   # the request holds blocks mid-stream
    # the client went away: the handler aborts, the engine frees the blocks before its next step
    assert _wait(lambda: (h := server.health())["in_flight"] == 0 and h["kv_free_blocks"] == total)
    assert server.health()["aborted"] == aborted0 + 1


def test_retry_after_is_the_shortest_remaining_request_at_the_mean_step_time():
    from types import SimpleNamespace

    from mixdiag.engine.serving.engine_loop import LoopStats
    from mixdiag.engine.serving.server import ServerConfig, ServingState, _Open

    model = SimpleNamespace(vocab_size=1024, max_model_len=512)
    config = SimpleNamespace(model=model, scheduler=SimpleNamespace(num_spec_tokens=0))
    loop = SimpleNamespace(engine=SimpleNamespace(config=config),
                           stats=LoopStats(steps=100, step_s_total=1.0))   # 10 ms a step
    st = ServingState(ServerConfig(), loop, None, None)
    assert st.retry_after_s() == 1                       # nothing open: the floor
    st.open["a"] = _Open(None, max_tokens=400, n_out=100)
    st.open["b"] = _Open(None, max_tokens=300, n_out=50)
    assert st.retry_after_s() == 3                       # b: 250 tokens x 10 ms = 2.5 s, rounded up
    loop.stats = LoopStats()
    assert st.retry_after_s() == 1                       # no step measured yet
