"""The steps of a deploy: pyinfra operations only. Each gets its part of the plan and yields
commands, or `host.noop` when the host already matches; none asks a fact."""
