"""Benchmarks shipped with sequence-ai (``seq eval run <policy> --benchmark <name>``).

Each module holds one ``@seq.benchmark`` class; importing it imports its simulator, so the
eval runner imports a benchmark only inside the env processes that run it.
"""
