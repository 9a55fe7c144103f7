"""The import rules of docs/contracts.md §0, checked on the source (issue 20): every module belongs to one room,
imports only from the rooms the table allows (imports inside functions count the same as module-level ones),
and no two modules import each other, directly or round a loop, even through function-level imports."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.import_graph import ROOT, Edge, cycles, edges_of, graph, modules, third_party_of  # noqa: E402

#: room -> (module prefixes it holds, rooms it may import). A module belongs to the room of its longest prefix.
#: Data flows one way: sources -> collectors -> Timeline -> diagnosis -> outputs; the engine is a source.
ROOMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # the contract and the words every room shares: nothing of ours (device_activity: the Timeline's activity
    # frame, its own module because schema.py is past its size and the frame has its own dtypes;
    # schema_columns, schema_validate: the contract's column table and its validation, split from schema.py by
    # concept when it passed 400 lines; schema re-exports both; label_arrays: label columns built by code, for
    # readers and diagnosis alike)
    "base": (("mixdiag", "mixdiag.schema", "mixdiag.schema_columns", "mixdiag.schema_validate",
              "mixdiag.device_activity", "mixdiag.causes", "mixdiag.wire", "mixdiag.errors", "mixdiag.fmt",
              "mixdiag.gpu_probe", "mixdiag.label_arrays"), ()),
    # the reference engine: config and hooks below both core and model, so the two never import each other
    "engine.common": (("mixdiag.engine", "mixdiag.engine.config", "mixdiag.engine.hooks"), ("base",)),
    "engine.model": (("mixdiag.engine.model",), ("base", "engine.common")),
    "engine.core": (("mixdiag.engine.core",), ("base", "engine.common", "engine.model")),
    "engine.telemetry": (("mixdiag.engine.telemetry",), ("base", "engine.common", "engine.model", "engine.core")),
    "engine.testbed": (("mixdiag.engine.testbed",),
                       ("base", "engine.common", "engine.model", "engine.core", "engine.telemetry")),
    "engine.serving": (("mixdiag.engine.serving",),
                       ("base", "engine.common", "engine.model", "engine.core", "engine.telemetry", "engine.testbed")),
    # readers of every source: they know formats, never the engine's code or the diagnosis
    "collectors": (("mixdiag.collectors",), ("base",)),
    # reasoning over the Timeline: no source name, no reader
    "diagnosis": (("mixdiag.diagnosis",), ("base",)),
    "ledger": (("mixdiag.ledger",), ("base",)),
    # an HTTP client that drives any OpenAI-compatible server
    "loadgen": (("mixdiag.loadgen",), ("base",)),
    # drives a real vLLM (a separate virtualenv) as a testbed: processes, files and HTTP, nothing of the analysis
    "vllm_testbed": (("mixdiag.vllm_testbed",), ("base", "loadgen")),
    # what-if replay of a run: the block pool is the engine's own (pure Python), the rest reads a Timeline
    "tuning": (("mixdiag.tuning",), ("base", "collectors", "diagnosis", "ledger", "engine.common", "engine.core",
                                     "report")),
    # text, HTML and Prometheus renderings of a Diagnosis
    # (report_diff: `mixdiag diff`'s text/JSON/HTML over the diagnosis room's Diff, as report.py over a Diagnosis)
    "report": (("mixdiag.report", "mixdiag.report_html", "mixdiag.report_breakdown", "mixdiag.report_since_start",
                "mixdiag.report_diff", "mixdiag.html_page", "mixdiag.exporter", "mixdiag.console"),
               ("base", "diagnosis", "ledger", "collectors")),
    "dashboard": (("mixdiag.dashboard",), ("base", "collectors", "diagnosis", "ledger", "report", "tuning")),
    # the CLI composes everything; only commands/serve_dashboard.py opens the dashboard (checked below)
    "cli": (("mixdiag.cli", "mixdiag.__main__", "mixdiag.commands"),
            ("base", "engine.common", "engine.model", "engine.core", "engine.telemetry", "engine.testbed",
             "engine.serving", "collectors", "diagnosis", "ledger", "loadgen", "tuning", "report", "dashboard",
             "vllm_testbed")),
}
#: inside collectors/prometheus/ one direction, lowest first: shared helpers; text parsing, the dialect's name
#: -> column table and the prefill-work spreading; HTTP fetching; interval building (scrape pairs, PromQL aggregates); readers; endpoint probing
PROMETHEUS_LEVELS: tuple[tuple[str, ...], ...] = (
    ("prom_common",), ("prom_text", "dialect_columns", "prefill_work"), ("prom_http", "concatenated"), ("prom_intervals", "prom_aggregate"),
    ("scrape_reader", "server_reader"), ("endpoint", "live"))
#: only the engine rooms import these (tests/mixdiag/test_imports.py checks the same at run time)
HEAVY = {"torch", "triton"}
#: scripts of ours that run in another interpreter (never imported by mixdiag): the vLLM testbed's model builder
#: runs as ``.venv-vllm/bin/python mixdiag/vllm_testbed/model_build.py`` (scripts/setup_vllm.sh, environment.py)
OTHER_INTERPRETER = {"mixdiag.vllm_testbed.model_build"}
#: package roots that hold only themselves (their __init__), never their whole subtree
EXACT = {"mixdiag", "mixdiag.engine"}


def room_of(module: str) -> str | None:
    best, best_len = None, -1
    for room, (prefixes, _) in ROOMS.items():
        for p in prefixes:
            if (module == p or (p not in EXACT and module.startswith(p + "."))) and len(p) > best_len:
                best, best_len = room, len(p)
    return best


def violations(edges: list[Edge]) -> list[str]:
    """Every edge that leaves its room for a room the table does not allow."""
    out = []
    for e in edges:
        a, b = room_of(e.importer), room_of(e.imported)
        if a is None or b is None:
            out.append(f"outside every room: {e}")
        elif a != b and b not in ROOMS[a][1]:
            out.append(f"{a} may not import {b}: {e}")
    return out


KNOWN, EDGES = graph()


def test_every_module_has_a_room():
    assert [m for m in KNOWN if room_of(m) is None] == []


def test_rooms_import_only_what_the_table_allows():
    assert violations(EDGES) == []


def test_no_import_cycle_between_modules():
    assert cycles(KNOWN, EDGES) == []


def test_only_the_dashboard_command_opens_the_dashboard():
    door = "mixdiag.commands.serve_dashboard"
    openers = sorted({e.importer for e in EDGES if room_of(e.imported) == "dashboard" and room_of(e.importer) != "dashboard"})
    assert openers == [door]


@pytest.mark.parametrize("room", [r for r in ROOMS if not r.startswith("engine")])
def test_only_the_engine_imports_torch_or_triton(room):
    bad = sorted(m for m, p in KNOWN.items() if room_of(m) == room and m not in OTHER_INTERPRETER
                 and third_party_of(p.read_text()) & HEAVY)
    assert bad == []


def test_prometheus_collectors_import_one_way():
    pkg = "mixdiag.collectors.prometheus."
    level = {pkg + m: i for i, names in enumerate(PROMETHEUS_LEVELS) for m in names}
    mods = sorted(m for m in KNOWN if m.startswith(pkg))
    assert [m for m in mods if m not in level] == []
    upward = [str(e) for e in EDGES if e.importer in level and e.imported in level and level[e.imported] >= level[e.importer]]
    assert upward == []


def test_scripts_for_another_interpreter_are_never_imported():
    assert [str(e) for e in EDGES if e.imported in OTHER_INTERPRETER] == []


def test_nothing_imports_the_pipeline_but_the_diagnosis_package_and_the_outputs():
    inside = sorted(e.importer for e in EDGES if e.imported == "mixdiag.diagnosis.pipeline"
                    and room_of(e.importer) == "diagnosis" and e.importer != "mixdiag.diagnosis")
    assert inside == []


# -- the checker itself can fail ----------------------------------------------------------------------------

PLANTED = {
    # a function-level import from the contract up into the diagnosis: a room violation and a cycle
    "back edge into diagnosis": ("mixdiag.schema", "def f():\n    from mixdiag.diagnosis import pipeline\n"),
    # a collector reaching into the engine's code
    "collector -> engine": ("mixdiag.collectors.registry", "import mixdiag.engine.core.records\n"),
    # the model importing the core (they must not import each other)
    "model -> core": ("mixdiag.engine.model.model", "from mixdiag.engine.core import scheduler\n"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_back_edge_is_caught(name):
    module, source = PLANTED[name]
    known = dict(KNOWN)
    known.setdefault(module, Path("planted.py"))
    planted = edges_of(module, source, known)
    assert planted, "the planted import was not read as an edge"
    assert violations(EDGES + planted) != []


def test_a_planted_function_level_cycle_is_caught():
    known = dict(KNOWN)
    a, b = "mixdiag.fmt", "mixdiag.causes"
    known.setdefault(a, Path("a.py"))
    planted = edges_of(a, "def f():\n    import mixdiag.causes\n", known) + \
        edges_of(b, "def g():\n    from mixdiag import fmt\n", known)
    assert any(set(c) >= {a, b} for c in cycles(known, EDGES + planted))


def test_the_graph_sees_function_level_imports():
    assert any(e.in_function for e in EDGES)
    assert len(KNOWN) > 100 and modules(ROOT) == KNOWN
