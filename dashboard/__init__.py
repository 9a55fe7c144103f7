"""The Dash dashboard and the Prometheus exporter of the diagnosis."""
