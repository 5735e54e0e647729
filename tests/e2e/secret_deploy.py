"""The deploy lock and the secret writer alone, for tests/e2e/test_hardening.py: whatever user
the inventory connects as (a non-root one with `_sudo` there), the host-wide lock is taken
through sudo and one secret file goes through `put_file(secret=True)`."""

from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, state

from operations.runtime.deploy_lock import Request
from operations.steps.host_files import put_file

why = Request(state, host, 60).answer()
if why is not None:
    raise PyinfraError(why)

put_file(
    name="Write the e2e secret",
    src=host.data.get("secret_text"),
    dest="/etc/sglang-e2e/secret.yaml",
    group="daemon",
    mode="640",
    dir_mode="750",
    dir_group="daemon",
    secret=True,
)
