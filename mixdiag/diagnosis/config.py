"""Every threshold of the diagnosis, one setting for every workload (docs/analyze.md), each with its
basis. Stages read their part: detection :class:`SpikeConfig` and :class:`SignalConfig`, evidence
:class:`FusionConfig`, rules :class:`AttributionConfig`; :class:`DiagnosisConfig` holds them all.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpikeConfig:
    """Thresholds of spike detection (detection/spikes.py, detection/interval_spikes.py)."""

    ratio: float = 1.5          # spike: latency > ratio x baseline ...
    mad_k: float = 2.0          # ... and > baseline + mad_k x robust sigma (noise guard)
    window_steps: int = 41      # centred rolling window of the step baseline (rows)
    window_intervals: int = 15  # centred rolling window of the interval baseline (rows)
    min_periods: int = 3        # reference rows needed inside a window before it gives a baseline
    # a starved stretch counts when the next ITL P99 is >= this x its duration (a request that waited
    # through it logs the wait as one ITL on resuming; below 1: slack for bucketed histogram quantiles)
    starve_confirm: float = 0.8
    # a step whose measured host gap beyond the usual one (gap_excess_s) is at least this share of its latency
    # is no baseline reference row: the GPU ran dry waiting on the host. Overlapped schedulers hide host work
    # (SGLang event_loop_overlap, vLLM async scheduling: usual gap ~0), synchronous ones pay the same host work
    # every step (the usual gap, already subtracted); healthy gap jitter is tens of microseconds on steps of
    # milliseconds (< 1 %), so 0.1 leaves healthy rows in; a wrong exclusion only drops one healthy row
    ref_gap_share: float = 0.1

    def __post_init__(self):
        if not self.ratio > 1.0:
            raise ValueError(f"SpikeConfig.ratio must be > 1, got {self.ratio}")
        if self.mad_k < 0:
            raise ValueError(f"SpikeConfig.mad_k must be >= 0, got {self.mad_k}")
        for name in ("window_steps", "window_intervals", "min_periods"):
            if getattr(self, name) < 1:
                raise ValueError(f"SpikeConfig.{name} must be >= 1")
        if not 0 < self.starve_confirm <= 1:
            raise ValueError("SpikeConfig.starve_confirm must be in (0, 1]")
        if not 0 < self.ref_gap_share <= 1:
            raise ValueError("SpikeConfig.ref_gap_share must be in (0, 1]")


@dataclass(frozen=True)
class SignalConfig:
    """Neighbourhood sizes of the relative signals and the tests on them (detection/signals.py)."""

    neighbour_window: int = 11   # centred window (steps) for SM activity / imbalance references
    gap_window: int = 41         # centred window (steps) for the typical inter-step gap
    # ... never above the instance's healthy band of gaps: low-side centre + this x sigma (regimes.
    # low_side_reference). A stall longer than half the window would otherwise become its own usual gap.
    # 3: the regimes' own noise guard (RegimeConfig.sigma_k); healthy host gaps vary with load inside it
    gap_band_sigma: float = 3.0
    # the usual expert imbalance is capped the same way (low-side centre + this x sigma): imbalance only rises
    # with a hotspot, and one covering most of the wide window would otherwise be its own reference
    imbalance_band_sigma: float = 3.0
    # imbalance, collective-share and SM-skew references: hotspot windows last tens of steps and
    # must not become their own reference
    wide_window: int = 201
    # periodicity: spikes near prefill events above chance at this binomial p-value ...
    period_alpha: float = 0.01
    period_min_near: int = 3     # ... and at least this many of them (one or two are a coincidence)
    # prefill work vs ITL excess across intervals: seeded permutations (same input, same answer)
    relation_perms: int = 999
    relation_seed: int = 0
    relation_min_rows: int = 6   # intervals with both values needed for a rank correlation
    relation_min_work: int = 3   # intervals holding prefill work (one or two are a coincidence)
    # LLM serving: at least this share of step rows decode (or replay FULL) ...
    llm_min_share: float = 0.2
    llm_min_rows: int = 10       # ... judged only with this many rows (fewer: no claim either way)
    # the decode graph mode of step rows is FULL once this share of decode steps replayed FULL
    # (signals.decode_graph_norm: engines replay whenever they can, so not replaying is the exception).
    # A healthy instance replays FULL on ~all decode steps; 0.2 still finds it under an eager episode
    # covering 80 % of a capture (tier d2 episodes run up to 500 of 800 steps), while an instance that
    # replays FULL only on a few small batches (captures cut short) keeps its usual mode
    full_norm_share: float = 0.2

    def __post_init__(self):
        if min(self.neighbour_window, self.gap_window, self.wide_window) < 3:
            raise ValueError("SignalConfig windows must be >= 3")
        if self.gap_band_sigma < 0 or self.imbalance_band_sigma < 0:
            raise ValueError("SignalConfig.gap_band_sigma and imbalance_band_sigma must be >= 0")
        if not 0 < self.period_alpha < 1 or not 0 < self.llm_min_share <= 1 or not 0 < self.full_norm_share <= 1:
            raise ValueError("SignalConfig.period_alpha must be in (0, 1), llm_min_share in (0, 1]")
        if min(self.period_min_near, self.relation_perms, self.relation_min_rows, self.relation_min_work,
               self.llm_min_rows) < 1:
            raise ValueError("SignalConfig counts must be >= 1")


@dataclass(frozen=True)
class FusionConfig:
    """Thresholds of fusing views of one engine (evidence/fusion.py)."""

    # EP ranks are one engine when their shared steps end within this x the median step duration
    # (they meet in the all-to-all every step; unrelated engines drift by whole steps)
    rank_align: float = 0.1
    # the usual host gap per step of an interval view: this percentile over its intervals, so stalls
    # in up to 3/4 of them do not raise it
    host_gap_percentile: float = 25.0

    def __post_init__(self):
        if not self.rank_align > 0 or not 0 <= self.host_gap_percentile <= 100:
            raise ValueError("FusionConfig.rank_align must be > 0, host_gap_percentile in [0, 100]")


@dataclass(frozen=True)
class AttributionConfig:
    """Evidence thresholds of the rules (rules/); justified in docs/analyze.md."""

    host_gap_share: float = 0.5     # host_stall: gap excess >= this share of the latency excess
    # host_stall on interval rows from the engine's count of GPU wait between forwards (detection/host_wait.py):
    # the wait beyond the usual must stand this many robust sigmas above the instance's own spread of it - the
    # spike test's noise guard (SignalConfig) at its usual 3
    host_wait_k: float = 3.0
    imbalance_rel: float = 1.5      # ep_hotspot: imbalance >= this x the neighbourhood's ...
    imbalance_abs: float = 1.5      # ... and >= this absolute max/mean ratio
    imbalance_edge_rel: float = 1.1  # interval next to a hotspot interval: imbalance >= this x the usual
    sm_delta: float = 0.10          # mixing: SM activity this much above decode-only neighbours
    interval_factor: float = 0.8    # confidence scale for interval (log/scrape) rows
    comm_delta: float = 0.10        # ep_hotspot: collective share this much above decode neighbours
    # ep_hotspot: slowest rank / median rank compute time (the one rank-skew threshold of the project)
    rank_skew: float = 1.2
    rank_sm_skew: float = 1.05      # ep_hotspot, graph-hidden compute: largest / median rank SM-busy time ...
    sm_skew_delta: float = 0.03     # ... and this much above its decode neighbourhood's
    eager_height: float = 2.5       # graph_fallback without counts: eager decode stays below this x baseline
    # graph_fallback from measured cost (no measured graph mode): a decode batch size whose steps
    # cost this x the last smaller size's beyond the row growth (decode cost grows at most in
    # proportion to rows); the reference engine's CPU graph miss measures 2.3x, a healthy +1
    # request ~1.0x (detection/shape_cost.py)
    shape_jump: float = 1.5
    shape_min_rows: int = 3         # ... each size seen in at least this many decode-only steps
    # Interval verdicts rest on each interval's own evidence (height, prefill work in it and its
    # neighbours, counters). Prefill work at least the instance's median work per interval names
    # mixing (less than the usual intervals held without spiking does not explain a spike); work
    # this many robust sigmas above the median stands out and earns more confidence. 2: the spike
    # test's own noise guard.
    work_mad_k: float = 2.0
    # Interval mixing from spread prefill work needs a prompt chunk that can slow a step: vLLM's
    # iteration-token histogram (the last chunk carries the whole prompt) must show, in the interval
    # or within one mean prefill time after it, an iteration this many tokens beyond the decode batch.
    # Basis: a step below the roofline ridge stays memory-bound (the weight read dominates) and costs
    # about a decode pass - bf16 on H100/H200 ~ 200-300 FLOP/byte, 2 FLOP per weight byte pair per
    # token -> ~200-300 tokens per step. Margin: the bucket's lower edge is read (up to 2x under).
    # On CPU the ridge is lower: shorter chunks can be felt there (docs/analyze.md, tier g).
    chunk_min_tokens: float = 256.0
    # The whole-run relation of prefill work and ITL excess (a permutation test) only moves
    # confidence: at most relation_weight, reached with rho >= relation_rho_full at p = 0, falling
    # linearly to nothing at p = relation_p_zero. One instance-wide p-value decided every interval's
    # verdict before (real vLLM: p = 0.002 -> all mixing, p = 0.014 -> all unknown, same traffic);
    # now those two differ by ~0.01 of confidence. 0.15 keeps an interval's mixing below the 0.7 of a
    # counted mixed step; rho 0.6 is a strong rank correlation.
    relation_weight: float = 0.15
    relation_rho_full: float = 0.6
    relation_p_zero: float = 0.1
    not_llm_cap: float = 0.5        # highest confidence on an input with no decode-like structure
    # Highest confidence of a verdict whose latency was read from stamps coarser than the usual
    # step latency (a step row's baseline below its instance's stamp resolution: whole-second log
    # stamps, ITL ~34 ms): a difference of two such stamps is known only to +-1 resolution, so
    # which forward - or whether time between forwards - made it is not measured. 0.5: no better
    # than the verdict of an input without decode structure (not_llm_cap).
    resolution_cap: float = 0.5

    def __post_init__(self):
        if not 0 < self.host_gap_share <= 1:
            raise ValueError("AttributionConfig.host_gap_share must be in (0, 1]")
        if self.host_wait_k < 0:
            raise ValueError("AttributionConfig.host_wait_k must be >= 0")
        if min(self.imbalance_rel, self.imbalance_abs, self.imbalance_edge_rel, self.rank_skew, self.rank_sm_skew) < 1:
            raise ValueError("AttributionConfig imbalance/rank-skew thresholds must be >= 1")
        if not 0 < self.interval_factor <= 1:
            raise ValueError("AttributionConfig.interval_factor must be in (0, 1]")
        if not 0 < self.relation_p_zero < 1 or self.comm_delta <= 0 or self.sm_skew_delta <= 0:
            raise ValueError("AttributionConfig.relation_p_zero must be in (0, 1), comm_delta and sm_skew_delta > 0")
        if not self.shape_jump > 1 or self.shape_min_rows < 1:
            raise ValueError("AttributionConfig.shape_jump must be > 1, shape_min_rows >= 1")
        if self.chunk_min_tokens < 0:
            raise ValueError("AttributionConfig.chunk_min_tokens must be >= 0")
        if not 0 <= self.relation_weight <= 1 or self.relation_rho_full <= 0 or self.work_mad_k < 0:
            raise ValueError("AttributionConfig.relation_weight must be in [0, 1], relation_rho_full > 0, "
                             "work_mad_k >= 0")
        if not 0 <= self.not_llm_cap <= 1 or not 0 <= self.resolution_cap <= 1:
            raise ValueError("AttributionConfig.not_llm_cap and resolution_cap must be in [0, 1]")


@dataclass(frozen=True)
class RegimeConfig:
    """Thresholds of the healthy reference, episodes (detection/regimes.py) and the split of excess by cause
    (rules/decomposition.py); the basis of each is in those modules' docstrings."""

    #: rows a stratum needs before it gets a reference of its own (fewer: the capture-wide one)
    min_stratum_rows: int = 30
    #: a stratum's reference is at most the next smaller stratum's x (their median batch ratio) x this:
    #: a healthy decode step grows at most linearly with its batch (regimes.reference); the margin allows
    #: the longer contexts a larger batch may carry
    stratum_growth_margin: float = 1.5
    #: centred rolling-median width: isolated spikes cannot lift it; a regime covering >= half does
    smooth_rows: int = 9
    #: an episode lasts at least this many rows; shorter elevated stretches are spikes
    min_rows: int = 5
    #: elevated runs separated by at most this many rows are one episode (a fault's noisy middle)
    merge_gap_rows: int = 3
    #: elevated: smoothed latency above ratio x reference ...
    ratio: float = 1.25
    #: ... and above reference + sigma_k x sigma (noise guard on very tight references)
    sigma_k: float = 3.0
    #: saturation: requests waited after at least this share of an instance's rows ...
    saturated_waiting_share: float = 0.5
    #: ... while the running batch stood within this share of its largest size in most of those rows
    saturated_running_share: float = 0.9

    def __post_init__(self):
        if self.smooth_rows < 1 or self.min_rows < 1 or self.merge_gap_rows < 0 or self.min_stratum_rows < 5:
            raise ValueError("RegimeConfig: row counts must be positive (min_stratum_rows >= 5)")
        if not self.stratum_growth_margin >= 1:
            raise ValueError("RegimeConfig: stratum_growth_margin must be >= 1")
        if not self.ratio > 1 or self.sigma_k < 0:
            raise ValueError("RegimeConfig: ratio must be > 1 and sigma_k >= 0")


@dataclass(frozen=True)
class BreakdownConfig:
    """Settings of the kernel and idle breakdown (diagnosis/breakdown/); bases in its modules' docstrings."""

    #: kernels listed per rank and step class
    top_kernels: int = 10
    #: a rank is a straggler of a step when its compute time is at least this x the median rank's (the
    #: same 1.25 the regime stage calls elevated) and the other ranks spent longer in communication
    straggler_ratio: float = 1.25

    def __post_init__(self):
        if self.top_kernels < 1:
            raise ValueError("BreakdownConfig.top_kernels must be >= 1")
        if not self.straggler_ratio > 1:
            raise ValueError("BreakdownConfig.straggler_ratio must be > 1")


@dataclass(frozen=True)
class DiagnosisConfig:
    """All thresholds of the diagnosis, one setting for every workload (docs/analyze.md)."""

    spikes: SpikeConfig = field(default_factory=SpikeConfig)
    signals: SignalConfig = field(default_factory=SignalConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    regimes: RegimeConfig = field(default_factory=RegimeConfig)
    #: interval rows: ITL P99 above this x the rolling P50 is a spike (healthy decode keeps
    #: P99 within 2x P50, per the article; bucketed histogram quantiles add slack).
    interval_ratio: float = 2.0

    def __post_init__(self):
        if not self.interval_ratio > 1:
            raise ValueError("DiagnosisConfig.interval_ratio must be > 1")
