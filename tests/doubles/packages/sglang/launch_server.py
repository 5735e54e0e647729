"""TEST DOUBLE of `python -m sglang.launch_server`: same entry point as the real module.

Importing it has no side effect (the deploy's install check imports it, as with the real one);
running it as __main__ starts the double server in sglang._server_double.
"""

if __name__ == "__main__":
    import sys

    from sglang._server_double import main

    sys.exit(main(sys.argv[1:]))
