"""Reusable test helpers (real servers, fixtures) shared by several test areas."""
