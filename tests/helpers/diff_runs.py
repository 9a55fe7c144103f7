"""Two tiny real runs of the reference engine for the `mixdiag diff` tests: the `tune` tests' small workload
(chat decodes plus long prompts chunked in) at chunk size 128 and at 64. One pair per test session."""
import pytest

from helpers.tune_scenario import SCENARIO

CHUNKS = (128, 64)


def scenario_at(chunk: int) -> str:
    """The small scenario with its token budget and chunk size set to ``chunk``."""
    text = SCENARIO.format(policy="token_budget")
    return text.replace("max_num_batched_tokens = 128\nchunked_prefill_size = 128",
                        f"max_num_batched_tokens = {chunk}\nchunked_prefill_size = {chunk}")


@pytest.fixture(scope="session")
def small_chunk_runs(tmp_path_factory):
    """{chunk: run directory} of the small scenario at each of CHUNKS."""
    from mixdiag.engine.testbed.session import RunRequest, run_scenario

    d = tmp_path_factory.mktemp("diff_runs")
    out = {}
    for chunk in CHUNKS:
        (d / f"s{chunk}.toml").write_text(scenario_at(chunk))
        run_scenario(RunRequest(scenario=str(d / f"s{chunk}.toml"), out=d / f"run{chunk}"))
        out[chunk] = d / f"run{chunk}"
    return out
