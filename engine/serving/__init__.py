"""The reference engine as an OpenAI-compatible HTTP server (``mixdiag serve``).

What lives here: ``tokenizer.py`` (the shipped byte-level BPE in ``tokenizer/``, or a checkpoint's
own ``tokenizer.json``; incremental detokenization for streams), ``openai_protocol.py`` (request
validation into engine inputs, OpenAI response/chunk/error bodies, SSE framing), ``engine_loop.py``
(the engine in its own thread: requests in through a queue, tokens out to per-request asyncio
queues), ``server.py`` (the Starlette app and uvicorn runner: ``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics``). docs/serving.md has the tour.
Nothing in the engine's other rooms imports from here.

May import: the engine's other rooms (core, model, telemetry, testbed), mixdiag.engine.config and the
base layer (mixdiag.errors). Never the collectors, diagnosis, dashboard or commands.
"""
