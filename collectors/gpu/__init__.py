"""GPU activity sources: dcgm-exporter scrapes and NVML samples (reader and live sampler), and
``dcgm.fill_intervals``, which ``collectors.load`` applies to Prometheus windows.

May import: mixdiag.schema, mixdiag.errors, mixdiag.collectors (provenance, text_input), and
mixdiag.collectors.prometheus (dcgm-exporter speaks Prometheus: parsing and the readers). pynvml lazily."""
