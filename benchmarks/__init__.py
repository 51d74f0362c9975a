"""Benchmark, profiling and figure tools (run from a checkout).

Each is a command: ``python -m benchmarks.bench``, ``benchmarks.rounds_bench``,
``benchmarks.scaling``, ``benchmarks.cohort_bench``, ``benchmarks.profile_round``,
``benchmarks.plot_views``; ``benchmarks.torch_reference`` is the PyTorch loop
the executors are compared with and ``benchmarks.machine`` describes the
device a result came from. Their results are the Markdown tables beside them.
The user's commands (main, sweep, evaluate, report) are in launch/.
"""
