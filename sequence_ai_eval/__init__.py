"""Evaluation: score deployed policies on simulated benchmarks (``seq eval ...``).

``plan`` checks and lays out an eval, ``runner`` runs it (``episode``: the env processes driving the sim
through the normal client) and summarizes it; each eval's record, episodes and videos are kept
under ``<data_dir>/evals`` by ``sequence_ai_data.evals`` (the gateway counts running evals from there). The
built-in benchmarks live in ``sequence_ai_sim.benchmarks`` and are imported only when used.
"""
