"""Byte accounting, per-round history and plots."""
