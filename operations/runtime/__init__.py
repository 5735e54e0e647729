"""The runtime that talks to pyinfra: the inventory session, the deploy lock, callbacks that run
commands on a host, the plan step that gathers the facts and refuses, and every use of pyinfra
beyond its documented API (pyinfra_internals.py; the inventory session holds the others)."""
