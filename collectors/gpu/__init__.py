"""GPU activity sources: dcgm-exporter scrapes and NVML samples (reader and live sampler).

May import: mixdiag.schema, mixdiag.errors, mixdiag.collectors (provenance, text_input). pynvml lazily."""
