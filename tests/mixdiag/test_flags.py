"""The shared CLI flag groups (mixdiag/commands/flags.py) and their mapping onto configs and options."""
import argparse

import pytest

from mixdiag.commands.flags import (add_instrumentation_flags, add_serve_flags, add_source_flags, add_step_flags,
                                    instrumentation_argv, instrumentation_config, source_options, step_options)
from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig
from mixdiag.errors import UserError


def test_instrumentation_flags_map_onto_the_config():
    p = argparse.ArgumentParser()
    add_instrumentation_flags(p)
    cfg = instrumentation_config(p.parse_args(["--serve", "9400", "--linger", "2", "--log-format", "both",
                                               "--profile", "20:60", "--scrape-interval", "0.5", "--no-nvtx",
                                               "--profile-light"]))
    assert cfg == InstrumentationConfig(nvtx=False, serve_port=9400, linger_s=2.0, log_formats=("vllm", "sglang"),
                                        profile=(20, 60), profile_ops=False, scrape_interval_s=0.5)
    assert instrumentation_config(p.parse_args([])) == InstrumentationConfig()
    with pytest.raises(UserError):
        instrumentation_config(p.parse_args(["--profile", "60:20"]))


@pytest.mark.parametrize("cfg", [
    InstrumentationConfig(),
    InstrumentationConfig(nvtx=False, serve_port=9400, linger_s=2.5, log_formats=("vllm", "sglang"),
                          decode_log_interval=7, profile=(20, None), profile_ops=False, scrape_interval_s=0.25),
    InstrumentationConfig(log_formats=("sglang",), profile=(0, 60)),
])
def test_instrumentation_argv_round_trip(cfg):
    p = argparse.ArgumentParser()
    add_instrumentation_flags(p)
    assert instrumentation_config(p.parse_args(instrumentation_argv(cfg))) == cfg


def test_step_and_source_flags_give_only_the_options_set():
    p = argparse.ArgumentParser()
    add_step_flags(p)
    add_source_flags(p)
    assert step_options(p.parse_args([])) == {} and source_options(p.parse_args([])) == {}
    args = p.parse_args(["--step-gap-ms", "2.5", "--step-range", " step ", "--duration", "0", "--interval", "0.5"])
    assert step_options(args) == {"step_gap_s": 0.0025, "step_range": "step"}
    assert source_options(args) == {"duration_s": 0.0, "interval_s": 0.5}
    with pytest.raises(UserError, match="--step-gap-ms"):
        step_options(p.parse_args(["--step-gap-ms", "0"]))


def test_serve_flags_take_the_verbs_default_port():
    p = argparse.ArgumentParser()
    add_serve_flags(p, port=9108)
    assert vars(p.parse_args([])) == {"host": "127.0.0.1", "port": 9108}
