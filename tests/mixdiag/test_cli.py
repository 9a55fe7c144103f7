"""CLI conventions: --help/--version, exit codes, one-line errors, --json purity."""
import json
import subprocess
import sys

import pytest

from mixdiag.cli import main


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "mixdiag", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_help_and_version():
    rc, out, _ = run_cli("--help")
    assert rc == 0 and "usage: mixdiag" in out
    rc, out, _ = run_cli("--version")
    assert rc == 0 and out.startswith("mixdiag ")


def test_bad_flag_is_one_line_exit_2():
    rc, out, err = run_cli("--no-such-flag")
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_unknown_verb_exit_2():
    rc, _, err = run_cli("frobnicate")
    assert rc == 2 and err.startswith("error: ")


def test_schema_json_is_pure():
    rc, out, err = run_cli("schema", "--json")
    assert rc == 0
    doc = json.loads(out)   # stdout is exactly one JSON document
    assert {c["name"] for c in doc["steps"]} >= {"instance", "step", "t_start_s", "kind", "graph_mode"}


@pytest.mark.parametrize("exc,code", [
    ("user", 2), ("missing", 2), ("internal", 1),
])
def test_error_mapping(monkeypatch, capsys, exc, code):
    """Errors raised by a verb become one line on stderr and the documented exit code."""
    import mixdiag.commands.show_schema as verb
    from mixdiag.errors import UserError

    def boom(args, console):
        if exc == "user":
            raise UserError("bad value for --foo")
        if exc == "missing":
            open("/no/such/file")
        raise RuntimeError("bug\nsecond line")

    monkeypatch.setattr(verb, "run", boom)
    assert main(["schema"]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    if exc == "missing":
        assert "/no/such/file" in err


def test_debug_shows_traceback(monkeypatch, capsys):
    import mixdiag.commands.show_schema as verb
    from mixdiag.errors import UserError

    def boom(args, console):
        raise UserError("nope")

    monkeypatch.setattr(verb, "run", boom)
    assert main(["schema", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_json_nan_becomes_null(capsys):
    from mixdiag.console import Console
    Console(json_mode=True).result("ignored", {"x": float("nan"), "y": [1.5, float("inf")]})
    assert json.loads(capsys.readouterr().out) == {"x": None, "y": [1.5, None]}


def test_closed_stdout_is_quiet():
    """`mixdiag ... | head` must not print an internal error when the reader goes away."""
    code = ("import sys, mixdiag.commands.show_schema as v\n"
            "def gone(args, console): raise BrokenPipeError(32, 'Broken pipe')\n"
            "v.run = gone\n"
            "from mixdiag.cli import main\n"
            "sys.exit(main(['schema']))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 141 and p.stderr == ""
