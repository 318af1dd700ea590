"""Development tooling beside the product: evaluations, fuzzers, crash trials, peer
baselines, plots and the Gemma 4 test model. Run from a checkout (`python -m galahad_dev`);
nothing in galahad_desktop imports it, and the bundle does not ship it."""
