"""The secret writer alone, for tests/e2e/test_hardening.py: whatever user the inventory
connects as (a non-root one with `_sudo` there), one file through `put_secret`."""

from pyinfra.context import host

from operations.secret_files import put_secret

put_secret(
    name="Write the e2e secret",
    src=host.data.get("secret_text"),
    dest="/etc/sglang-e2e/secret.yaml",
    group="daemon",
    mode="640",
    dir_mode="750",
    dir_group="daemon",
)
