"""What the host scripts share (standard library only): credentials masked out of anything
they print, and who listens on a port.

Not run on its own: operations/render/host_scripts.py inlines it into each script that imports it
(programs/smoke.py, programs/wait_healthy.py), so the host gets one self-contained file. The
controller imports the masking from here too (operations/redact.py): one copy.
"""

from __future__ import annotations

import ipaddress
import pwd
import re
import socket
import struct
import subprocess
import urllib.parse
from typing import NamedTuple

# ---- masking: URL credentials, secret fields and flags, a journal's tail --------------------
MASK = "***"
_URL = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>[^\s'\"<>`]+)")
# USERINFO@ at the start of what follows "://". A password may hold '/' or '@' (`user:pa/ss@h`,
# `user:p@ss@h`): it runs to the '@' that a host and the end of the authority follow. Userinfo
# without ':' (a bare token) stops at the first '/', '?' or '#'; hf://org/name@rev has none.
_USERINFO = re.compile(
    r"^(?:[^/@?#:]*:.*?|[^/@?#:]*)@(?=[A-Za-z0-9.\-\[\]:]+(?:[/?#),;]|$))", re.DOTALL
)
# A token as a path segment of an http(s) URL: after /t/ (anaconda.org), or a long random
# segment (Gemfury, Cloudsmith: https://dl.cloudsmith.io/TOKEN/org/repo/python/simple/).
_PATH_TOKEN = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_~-]{20,}$")
# name=value fields (ServerArgs' repr, an environment dump) and flags, in any log line.
_SECRET_FIELD = re.compile(
    r"(?P<name>\b(?:[a-z_]*api_key|[a-z_]*hf_token|HF_TOKEN|token|password|secret)\s*[=:]\s*)"
    r"(?!None\b)(?:'[^']*'|\"[^\"]*\"|[^\s,)'\"]+)"
)
_SECRET_FLAG = re.compile(r"(?P<name>(?:--[a-z-]*api-key|--token|Bearer)[ =]+)[^\s'\",)]+")


def _mask_url(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    rest = _USERINFO.sub(MASK + "@", rest, count=1)
    if scheme.lower() not in ("http", "https"):
        return f"{scheme}://{rest}"
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    head, slash, tail = path.partition("/")
    parts = tail.split("/") if slash else []
    for i, part in enumerate(parts):
        if (i > 0 and parts[i - 1] == "t") or _PATH_TOKEN.match(part):
            parts[i] = MASK
    if question:
        pairs = query.split("&")
        query = "&".join(p.split("=", 1)[0] + "=" + MASK if "=" in p else p for p in pairs)
    return f"{scheme}://{head}{slash}{'/'.join(parts)}{question}{query}{hash_}{fragment}"


def mask_urls(text: str) -> str:
    """Every URL's credentials in a text (userinfo, query values, path tokens) replaced."""
    return _URL.sub(_mask_url, text)


def mask_journal(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Text with every credential masked: each of `secrets` (the key itself, where it is
    known) wherever it appears, URL userinfo, query values and path tokens, fields such as
    api_key='...' (SGLang logs its ServerArgs at start) and --api-key/Bearer values."""
    for secret in secrets:
        if secret.strip():
            text = text.replace(secret.strip(), MASK)
    text = mask_urls(text)
    text = _SECRET_FIELD.sub(lambda m: m.group("name") + repr(MASK), text)
    return _SECRET_FLAG.sub(lambda m: m.group("name") + MASK, text)


JOURNAL_LINES = 40


def journal(unit: str, secrets: tuple[str, ...] = ()) -> str:
    """The unit's last JOURNAL_LINES lines, masked (SGLang logs its ServerArgs, api_key
    included, at start; `secrets`: the key itself, where it is known)."""
    return mask_journal(
        subprocess.run(
            ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout,
        secrets,
    )


# ---- listener owners ----------------------------------------------------------------------
# Who may be sent the API key, or believed healthy: the TCP listener on the target's address and
# port must belong to the service user, and the target's unit must be active. Anyone may bind a
# free port above 1024 (a stopped rank's, or a restarting one's); only its uid tells them apart.
# /proc/net/tcp and tcp6 (net/ipv4/tcp_ipv4.c get_tcp4_sock, net/ipv6/tcp_ipv6.c get_tcp6_sock):
# `sl local_address rem_address st ... uid timeout inode`, addresses as hex words of 32 bits in
# host byte order and ports as 4 hex digits; st 0A is TCP_LISTEN (include/net/tcp_states.h).
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"


class Listener(NamedTuple):
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    uid: int


def _hex_address(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    addr, _, port = field.partition(":")
    words = [int(addr[i : i + 8], 16) for i in range(0, len(addr), 8)]
    packed = b"".join(struct.pack("=I", word) for word in words)
    return ipaddress.ip_address(packed), int(port, 16)


def parse_listeners(text: str) -> list[Listener]:
    """The listening sockets in one /proc/net/tcp or tcp6 text (its header line skipped)."""
    found = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 7 and cols[3] == TCP_LISTEN:
            address, port = _hex_address(cols[1])
            found.append(Listener(address, port, int(cols[7])))
    return found


def read_listeners() -> list[Listener]:
    found: list[Listener] = []
    for path in PROC_NET_TCP:
        try:
            with open(path, encoding="ascii") as fh:
                found += parse_listeners(fh.read())
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
    return found


def _takes(listener: Listener, target: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a connection to `target` may reach `listener` (same port): its own address, the
    wildcard of its family, or an IPv6 wildcard or mapped address for an IPv4 target (dual-stack
    unless IPV6_V6ONLY, which /proc does not show: counted as reaching it)."""
    address = listener.address
    if address == target or (address.version == target.version and address.is_unspecified):
        return True
    if target.version == 4 and address.version == 6:
        return address.is_unspecified or address == ipaddress.ip_address(f"::ffff:{target}")
    return False


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def listening(url: str, listeners: list[Listener] | None = None) -> tuple[str, list[Listener]]:
    """(ADDRESS:PORT of `url`, every listener a connection to it may reach)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        targets = {ipaddress.ip_address(host)}
    except ValueError:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
        targets = {ipaddress.ip_address(info[4][0]) for info in infos}
    if listeners is None:
        listeners = read_listeners()
    reaching = [
        item
        for item in listeners
        if item.port == port and any(_takes(item, target) for target in targets)
    ]
    return where, reaching


def owner_problem(where: str, reaching: list[Listener], service_user: str) -> str | None:
    """Why the listeners on `where` are not the service user's (its uid resolved here, on the
    host); None when one listens and every one is."""
    try:
        uid = pwd.getpwnam(service_user).pw_uid
    except KeyError:
        return f"the service user {service_user!r} does not exist on this host"
    if not reaching:
        return f"nothing listens on {where}"
    for item in reaching:
        if item.uid != uid:
            return (
                f"{where} is held by uid {item.uid} ({user_name(item.uid)}), not by the "
                f"service user {service_user} (uid {uid})"
            )
    return None


def _active_states(out: str) -> list[str]:
    return [
        line[12:].strip() or "unknown"
        for line in out.splitlines()
        if line.startswith("ActiveState=")
    ]


def units_active(units: list[str]) -> dict[str, str]:
    """Each unit's ActiveState as systemd says it ("active", "inactive", "failed", ...), from
    one `systemctl show` for all of them: it prints one block per unit named, in the order
    named (systemctl(1), "show"). An answer that does not have one state per unit is asked
    again unit by unit."""
    names = list(dict.fromkeys(units))
    if not names:
        return {}

    def show(asked: list[str]) -> list[str]:
        out = subprocess.run(
            ["systemctl", "show", *asked, "-p", "ActiveState"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return _active_states(out)

    states = show(names)
    if len(states) != len(names):
        states = [(show([name]) or ["unknown"])[0] for name in names]
    return dict(zip(names, states, strict=True))


def state_problem(unit: str, where: str, state: str) -> str | None:
    """Why whatever listens on `where` is not `unit` (its ActiveState `state`, units_active's,
    is not active); None when it is."""
    if state != "active":
        return f"{unit} is {state}: whoever listens on {where} is not it"
    return None
