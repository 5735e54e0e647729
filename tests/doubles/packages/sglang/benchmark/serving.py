"""TEST DOUBLE of `python -m sglang.benchmark.serving` (0.5.15 on; cli_main in that wheel's
sglang/benchmark/serving.py): the client double in sglang._bench_double. tests/doubles/wheels.py
leaves this package out of a release whose client is sglang.bench_serving."""

if __name__ == "__main__":
    import sys

    from sglang._bench_double import main

    sys.exit(main(sys.argv[1:]))
