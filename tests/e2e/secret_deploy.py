"""The deploy lock and the secret writer alone, for tests/e2e/test_hardening.py: whatever user
the inventory connects as (a non-root one with `_sudo` there), the host-wide lock is taken
through sudo and one file goes through `put_secret`."""

from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, state

from operations.deploy_lock import hold
from operations.secret_files import put_secret

why = hold(state, host, 60)
if why is not None:
    raise PyinfraError(why)

put_secret(
    name="Write the e2e secret",
    src=host.data.get("secret_text"),
    dest="/etc/sglang-e2e/secret.yaml",
    group="daemon",
    mode="640",
    dir_mode="750",
    dir_group="daemon",
)
