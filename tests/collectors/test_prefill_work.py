"""prefill_work.spread_prefill_work / prefill_work_column: vLLM counts a prompt's tokens when its first
token comes (formats.md §1.1 traps), so interval rows get them spread back over the prefill time."""
import math

import numpy as np
import pytest

from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.prometheus.prefill_work import spread_finished_work, spread_prefill_work

T0, T1 = [0.0, 1.0, 2.0], [1.0, 2.0, 3.0]


def test_tokens_spread_over_the_prefill_time_before_the_first_tokens():
    # 1000 prompt tokens got their first token in [2, 3]; their prefill took 2 s. First token at f,
    # work over [f - 2, f]: on average 1/4 in [0, 1], 1/2 in [1, 2], 1/4 in [2, 3].
    got = spread_prefill_work(T0, T1, [0, 0, 1000], [0, 0, 2.0], [0, 0, 1])
    assert got == pytest.approx([250, 500, 250])


def test_work_before_the_capture_is_dropped_and_zero_prefill_stays_put():
    got = spread_prefill_work(T0, T1, [1000, 0, 0], [2.0, 0, 0], [1, 0, 0])
    assert got[0] == pytest.approx(250) and got[1:].sum() == 0  # 3/4 ran before t = 0
    assert spread_prefill_work(T0, T1, [0, 600, 0], [0, 0, 0], [0, 0, 5]) == pytest.approx([0, 600, 0])


def test_no_prefill_time_observed_means_no_column():
    assert np.isnan(spread_prefill_work(T0, T1, [0, 0, 1000], [0, 0, 0], [0, 0, 0])).all()


def test_prefill_time_is_read_from_requests_finishing_one_decode_time_later():
    # request_prefill_time_seconds is observed at finish: with a 1 s mean decode, the requests that got
    # their first token in [0, 1] finish in the intervals ending by 1 + 1 + 1 = 3 s; the 0.5 s prefill
    # observed in [5, 6] (another population) is outside that window.
    t0, t1 = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    got = spread_prefill_work(t0, t1, [0, 1000, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 5.0], [0, 0, 1, 0, 0, 1],
                              [0, 0, 1.0, 0, 0, 1.0], [0, 0, 1, 0, 0, 1])
    # D = 1 s for the [1, 2] tokens: half in [0, 1], half in [1, 2]
    assert got == pytest.approx([500, 500, 0, 0, 0, 0])


V = 'engine="0",model_name="m"'
LAT = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0]


def _scrape(prompt, pre_n, pre_sum, with_prefill_time=True):
    lines = ["# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{V}}} {prompt}",
             "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{V}}} {prompt // 10}",
             f"vllm:num_requests_running{{{V}}} 4"]
    if with_prefill_time:
        lines.append("# TYPE vllm:request_prefill_time_seconds histogram")
        for b in LAT:
            lines.append(f'vllm:request_prefill_time_seconds_bucket{{{V},le="{b}"}} {pre_n if b >= 2.0 else 0}')
        lines += [f'vllm:request_prefill_time_seconds_bucket{{{V},le="+Inf"}} {pre_n}',
                  f"vllm:request_prefill_time_seconds_count{{{V}}} {pre_n}",
                  f"vllm:request_prefill_time_seconds_sum{{{V}}} {pre_sum}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("with_prefill_time", [True, False])
def test_capture_rows_get_the_inferred_column_only_with_the_prefill_histogram(with_prefill_time):
    scrapes = [(0.0, _scrape(0, 0, 0.0, with_prefill_time)), (1.0, _scrape(0, 0, 0.0, with_prefill_time)),
               (2.0, _scrape(0, 0, 0.0, with_prefill_time)), (3.0, _scrape(1000, 1, 2.0, with_prefill_time))]
    tl = scrape_reader.read_scrapes(scrapes, instance="v")
    st = tl.steps.sort_values("step")
    assert list(st["prefill_tokens"]) == [0, 0, 1000]  # the counter: all in the last interval
    if not with_prefill_time:
        # a schema column: present, but nothing is inferred without the prefill-time histogram
        assert "prefill_work_tokens" not in tl.meta["signals"]["v"] and st["prefill_work_tokens"].isna().all()
        return
    assert list(st["prefill_work_tokens"]) == pytest.approx([250, 500, 250])
    assert tl.meta["signals"]["v"]["prefill_work_tokens"] == "inferred"
    assert tl.meta["metric_sources"]["v"]["prefill_work_tokens"].startswith("vllm:request_prefill_time_seconds")
    assert not any(math.isnan(v) for v in st["prefill_work_tokens"])


def _epoch_capture(start_s: float, n: int = 600, seed: int = 3) -> list[tuple[float, str]]:
    """``n`` s of 1 s scrapes with bursts of prompts finishing (seeded); stamps start at ``start_s``."""
    rng = np.random.default_rng(seed)
    prompt, pre_n, pre_sum, out = 0, 0, 0.0, []
    for i in range(n + 1):
        out.append((start_s + i + float(rng.uniform(0, 0.05)), _scrape(prompt, pre_n, round(pre_sum, 6))))
        if rng.random() < 0.4:  # requests reaching their first token in the next interval
            k = int(rng.integers(1, 8))
            prompt += k * int(rng.choice([512, 2048, 8000, 30000]))
            pre_n += k
            pre_sum += k * float(rng.uniform(0.01, 3.0))
    return out


def test_epoch_stamps_give_no_negative_work_and_the_same_spread():
    # Regression (issue 22): 10 min of 1 s vLLM scrapes stamped in Unix time failed with
    # "column 'prefill_work_tokens' has negative values (min -4.0)": the prefix sums multiplied
    # epoch seconds (~1.76e9) by token rates and cancelled. The same capture stamped from 0 is the
    # reference: only the stamps' own float64 resolution (~2e-7 s at 1.76e9) may differ.
    epoch = scrape_reader.read_scrapes(_epoch_capture(1.76e9), instance="v").steps.sort_values("step")
    zero = scrape_reader.read_scrapes(_epoch_capture(0.0), instance="v").steps.sort_values("step")
    w_epoch, w_zero = epoch["prefill_work_tokens"].to_numpy(), zero["prefill_work_tokens"].to_numpy()
    assert len(w_epoch) == 600 and (w_epoch >= 0).all() and (w_zero >= 0).all()
    assert w_epoch == pytest.approx(w_zero, abs=0.5)
    assert w_epoch.sum() == pytest.approx(w_zero.sum(), rel=1e-9, abs=1.0)
