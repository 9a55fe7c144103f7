"""Collectors: readers that turn every real source into the Timeline data contract."""
