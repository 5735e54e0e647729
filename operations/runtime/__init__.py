"""The runtime that talks to pyinfra: the inventory session, the deploy lock, the SSH connection,
callbacks that run commands on a host, and the plan step that gathers the facts and refuses."""
