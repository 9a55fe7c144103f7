"""Detection, the first stage of the diagnosis: per-row signals, the latency decodes felt, its baseline
and which rows spike - on step rows (:mod:`.step_view`, :mod:`.spikes`) and interval rows
(:mod:`.interval_spikes`, :mod:`.interval_batch`) - and what is known of each instance as a whole
(:mod:`.context`). Detection names no cause. Stretches of steady behaviour (regimes, episodes)
are found here too, before any evidence is read.

May import: mixdiag.schema, mixdiag.causes, mixdiag.diagnosis.config, mixdiag.diagnosis.groupwise."""
