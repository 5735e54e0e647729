"""TEST DOUBLE of `python -m sglang.bench_serving`: the implementation up to 0.5.14, a
deprecated stub forwarding to sglang.benchmark.serving from 0.5.15 (that wheel's
sglang/bench_serving.py:1-22). Both run the client double in sglang._bench_double."""

if __name__ == "__main__":
    import sys

    from sglang._bench_double import main

    sys.exit(main(sys.argv[1:]))
