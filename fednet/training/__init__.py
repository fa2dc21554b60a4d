"""The torch training and evaluation loops (the only place that runs them)."""
