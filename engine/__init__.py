"""Reference mixed-batch inference engine (PyTorch + Triton), instrumented; the testbed.

Rooms, lowest first; each may import the rooms before it and the base layer (mixdiag.schema, causes,
wire, errors, fmt, gpu_probe), never one after it:

* ``config.py`` (the frozen engine configuration) and ``hooks.py`` (the ``Tracer`` seam): engine-level
  modules every room reads; they import only the base layer.
* ``model/``: the forward pass. ``core/``: the step loop around it.
* ``telemetry/``: what watches the engine. ``testbed/``: scenarios, faults, runs.
  ``serving/``: the OpenAI-compatible server.

Nothing here imports mixdiag.collectors, mixdiag.diagnosis, mixdiag.dashboard or mixdiag.commands;
the CLI parses flags and hands the engine parsed values (mixdiag/commands/flags.py).
"""
