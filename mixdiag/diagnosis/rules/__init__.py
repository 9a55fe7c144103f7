"""Rules, the third stage: the only place evidence becomes a cause and a confidence
(:mod:`.attribution` dispatches to the step, interval and fused rules; :mod:`.rule_context` holds what
they share). A per-cause decomposition of a spike's excess belongs here, beside attribution.

May import: base, mixdiag.diagnosis.config, mixdiag.diagnosis.detection."""
