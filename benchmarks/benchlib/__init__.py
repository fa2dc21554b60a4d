"""What the benchmark scripts in benchmarks/ share (issue 37 item 5).

The scripts stay where they are and run as `python3 benchmarks/NAME.py ...` (the commands that
BENCHMARKS.md and docs/benchmarks/history.md record). Running a script puts benchmarks/ first on
sys.path, so `import benchlib` finds this package; a script loaded by file path (the dashboard,
tests/harness.py's `bench(name)`) puts benchmarks/ there itself. The package is named
`benchlib`, not `benchmarks`, because Opacus installs a top-level `benchmarks` package: nothing
here is imported under that name, so the two can never shadow each other.

util        machine facts, tables, statistics, the JSON every script writes (write_json) and
            its headline rows for benchmarks/dashboard.py
runner      how a script runs fednet: the command, a timed subprocess (its stderr lines with
            their times, its CPU seconds), summary.json and metrics.jsonl, memory samplers,
            stopping a process tree
parts       the device check's parts, each a subprocess under a shared time budget
trace       `fednet launch` in a process whose steps are time-stamped (bench_launch.py (d),
            bench_many.py's scale part), and the fork probe
timing      a round's time split from round_timing_plugin.py's events (bench_many.py's big part)
plain       the plain PyTorch FedAvg round fednet is timed against (plain_loop.py,
            gpu_children.py)
golden_record  what golden.py hashes: arrays, the clients' models and state after a run
trust       the trust-boundary harness of bench_trust.py: `fednet server`/`clients`
            processes, raw ZMTP connections, an insider's READY(hello)
trust_scenarios  bench_trust.py's scenarios (also run by tests/integration/test_liveness.py
            and test_resources.py)
gpu_device, gpu_children, gpu_parts, gpu_report   gpu_check.py by job: reading device memory,
            the processes it starts, its parts, its table and targets
"""
