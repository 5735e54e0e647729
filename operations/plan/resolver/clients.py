"""Where clients send their requests: the gateway (the router) when the settings put one in
front, else each rank's own port; and whether they must send the key of api_key_file. The plan
shows it as its `clients` row, so a dry run says which endpoint to give a client."""

from __future__ import annotations

from operations import layout
from operations.plan.resolver.context import Resolution
from operations.plan.vocabulary import Decision

# A bind on every address: clients use the router host's own address (its inventory name here).
ANY_ADDRESS = ("0.0.0.0", "::")


def client_endpoint(ctx: Resolution) -> Decision:
    """The `clients` decision: the URL a client's OpenAI base_url is, and the key it sends."""
    s = ctx.s
    key = (
        f"send the key in api_key_file {s.api_key_file} as a bearer token"
        if s.api_key_file
        else "no key: anyone who reaches it is served (set api_key_file)"
    )
    router = s.router
    if router is not None:
        address = router.host if router.bind in ANY_ADDRESS else router.bind
        url = layout.worker_url(address, router.port) + "/v1"
        why = (
            f"the router on {router.host} (bind {router.bind}:{router.port}) spreads requests "
            f"over every rank behind it and skips one that is restarting; {key}"
        )
        return Decision(
            "clients", f"{url} (the router); {'key' if s.api_key_file else 'no key'}", why
        )
    last = s.base_port + s.dp_size - 1
    first_url = layout.worker_url(s.server_host, s.base_port) + "/v1"
    ports = f"{s.base_port}" if last == s.base_port else f"{s.base_port}-{last}"
    why = (
        f"no router in front (set router to put a gateway before the ranks): each rank serves "
        f"on its own port ({ports} on {s.server_host}), and a client that uses one rank loses "
        f"it while that rank restarts; {key}"
    )
    value = f"{first_url} (one rank; ports {ports}); {'key' if s.api_key_file else 'no key'}"
    return Decision("clients", value, why)


def clients(ctx: Resolution) -> None:
    ctx.plan.decisions.append(client_endpoint(ctx))
