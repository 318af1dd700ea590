"""Benchmarks and evaluations: measured side by side in one run, reported as ratios."""
