"""Outbound calls to URLs a tenant chose: the egress policy and the one way to send.

Why one module: an alert webhook URL is set by whoever holds an API key, and the
worker then sends from inside the operator's network. Without a policy that is a
server-side request forgery tool (``http://169.254.169.254/…``, ``http://127.0.0.1:5432``,
``http://2130706433/``). Every check — of address literals at save time in the console and
CLI, and of every URL at send time in the worker — goes through here, so there is one rule
to read and test.

The rule (DESIGN.md §9):

- Resolve the host **once per delivery** and check **every** address it resolves to;
  refuse loopback, private, link-local, unique-local, shared (CGNAT), reserved,
  multicast and unspecified addresses, and IPv4 addresses hidden inside IPv6
  (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``). IPv4
  literals in the forms ``inet_aton`` accepts (``2130706433``, ``0x7f.1``, ``127.1``,
  ``0177.0.0.1``) are read as the address they are, not as names.
- Connect to the address that was checked (the URL's host is replaced by it; ``Host``
  and TLS SNI keep the name, so certificates are still verified against it): no second
  DNS lookup between the check and the connection, so DNS rebinding cannot slip in.
- No redirects, no proxies from the environment, one total deadline for resolution,
  connection, request and response, and at most ``max_response_bytes`` read back.
- The caller gets a coarse outcome (``delivered``, ``refused by policy``,
  ``unreachable``, ``timed out``, ``HTTP 5xx``…); the exception text goes to the
  operator's log only, so the outcome is not a port scanner.
- Names are resolved only to send, never when a URL is saved, and a name that does not
  resolve and one that resolves to a refused address are both ``unreachable``: neither
  saving nor the delivery log tells a tenant whether an internal name exists.
  (``refused by policy`` is for address literals, which reveal nothing.)

Operators who run receivers on a private network allow them explicitly with
``WALKEEP_ALERT_EGRESS_ALLOW`` (comma-separated CIDRs or host names). On the local
network profile the default is ``loopback`` (127.0.0.0/8 and ::1), said at start.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Coarse outcomes: all a tenant ever sees of a delivery.
DELIVERED = "delivered"
REFUSED = "refused by policy"
UNREACHABLE = "unreachable"
TIMED_OUT = "timed out"
COARSE_OUTCOMES = frozenset({DELIVERED, REFUSED, UNREACHABLE, TIMED_OUT})


def http_outcome(status: int) -> str:
    """``HTTP 2xx`` … ``HTTP 5xx``: the class of a receiver's answer."""
    return f"HTTP {status // 100}xx"


class EgressRefused(Exception):
    """The URL's host is, or resolves to, an address the policy refuses."""


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which addresses a tenant's URL may reach beyond the public internet."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, spec: str) -> EgressPolicy:
        """``"10.0.0.0/8, hooks.corp.example, loopback"``; ``""`` or ``"none"``: nothing.

        Raises ValueError naming the entry that is neither a network nor a host name.
        """
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in spec.split(","):
            entry = raw.strip()
            if not entry or entry.lower() == "none":
                continue
            if entry.lower() == "loopback":
                networks.extend(LOOPBACK)
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _normal_host(entry)
            if not name or any(c in name for c in "/:@ ") or literal_ip(name) is not None:
                raise ValueError(f"{entry!r} is neither a CIDR nor a host name")
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def describe(self) -> str:
        """One line for the start-up banner and logs."""
        parts = [str(n) for n in self.networks] + sorted(self.hosts)
        return ", ".join(parts) if parts else "public addresses only"

    def allows_host(self, host: str) -> bool:
        return _normal_host(host) in self.hosts

    def check(self, host: str, addresses: Iterable[IPAddress]) -> IPAddress:
        """The address to connect to, if every one ``host`` resolved to is allowed.

        All of them, not just the first: a name answering with one public and one
        private address must not be a coin toss.
        """
        chosen: IPAddress | None = None
        trusted = self.allows_host(host)
        for address in addresses:
            effective = unwrap(address)
            allowed = trusted or any(effective in n for n in self.networks)
            if not allowed and not is_public(effective):
                raise EgressRefused(f"{host} resolves to {effective}, which is not public")
            if chosen is None:
                chosen = effective
        if chosen is None:
            raise EgressRefused(f"{host} resolves to no address")
        return chosen


def start_notice(policy: EgressPolicy, *, default: bool) -> str:
    """What ``walkeep serve`` and the worker say at start about where alerts may go."""
    if not policy.networks and not policy.hosts:
        return "public addresses only"
    why = "the local network's default" if default else "WALKEEP_ALERT_EGRESS_ALLOW"
    return f"public addresses and {policy.describe()} ({why})"


def _normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def literal_ip(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any form a resolver would read as one, or None.

    ``inet_aton`` is what getaddrinfo uses for IPv4 literals, so it accepts exactly the
    odd forms an attacker would try (``2130706433``, ``0x7f.1``, ``127.1``, octal).
    """
    host = _normal_host(host)
    if not host:
        return None
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if all(c in "0123456789abcdefx." for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def is_public(address: IPAddress) -> bool:
    """Globally routable unicast: not loopback, private, link-local, unique-local,
    shared, reserved, multicast or unspecified (Python's ``ipaddress`` tables)."""
    address = unwrap(address)
    return bool(
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not address.is_unspecified
        and not address.is_loopback
        and not address.is_link_local
    )


async def resolve_async(host: str, port: int) -> list[IPAddress]:
    literal = literal_ip(host)
    if literal is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(_normal_host(host), port, type=socket.SOCK_STREAM)
    return _addresses(infos)


def _addresses(infos: Iterable[tuple[object, ...]]) -> list[IPAddress]:
    out: list[IPAddress] = []
    for info in infos:
        sockaddr = info[4]
        assert isinstance(sockaddr, tuple)
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    return out


def _port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme.lower() == "https" else 80)


def is_localhost(host: str) -> bool:
    """``localhost`` and ``*.localhost``: loopback by definition (RFC 6761), no DNS asked."""
    name = _normal_host(host)
    return name == "localhost" or name.endswith(".localhost")


def check_url(url: str, policy: EgressPolicy) -> None:
    """Save-time check, without DNS: refuse a URL whose host *is* a refused address (an
    address literal in any spelling, or ``localhost``).

    A name is not looked up when it is saved: refusing the names that resolve to private
    addresses and accepting the ones that do not resolve told a tenant which internal
    names exist. Every delivery resolves and checks the name (:func:`send`), and a name
    that resolves nowhere reads there exactly like one that resolves to a refused address.
    """
    host, _ = _port(url)
    literal = literal_ip(host)
    if literal is not None:
        policy.check(host, [literal])
    elif is_localhost(host):
        policy.check(host, [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")])


_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """One TLS context for every delivery (verifying certificates, as httpx's default).
    A client built without one loads the CA bundle again: ~40 ms of CPU on the event
    loop per delivery, which every other account's delivery waited through."""
    global _TLS
    if _TLS is None:
        _TLS = httpx.create_ssl_context()
    return _TLS


@dataclass(frozen=True, slots=True)
class Sent:
    """What one delivery came to: ``outcome`` for the tenant, ``detail`` for the log."""

    outcome: str
    status_code: int | None
    duration_ms: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == DELIVERED


async def send(
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    policy: EgressPolicy,
    deadline_seconds: float,
    max_response_bytes: int,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Sent:
    """POST ``body`` to ``url`` under the policy, within ``deadline_seconds`` in total.

    Never raises for anything the receiver or the network does: every failure is a
    coarse :class:`Sent` outcome (the detail is for the operator's log).
    """
    started = time.monotonic()

    def done(outcome: str, code: int | None = None, detail: str = "") -> Sent:
        return Sent(outcome, code, int((time.monotonic() - started) * 1000), detail)

    host, port = _port(url)
    try:
        async with asyncio.timeout(deadline_seconds):
            try:
                addresses = await resolve_async(host, port)
            except (OSError, UnicodeError) as exc:
                return done(UNREACHABLE, detail=f"resolving {host}: {exc}")
            try:
                address = policy.check(host, addresses)
            except EgressRefused as exc:
                # A name that resolves to a refused address reads as one that does not
                # resolve: the outcome must not tell which internal names exist.
                refused = REFUSED if literal_ip(host) is not None else UNREACHABLE
                return done(refused, detail=str(exc))
            pinned, request_headers, extensions = _pin(url, address, headers)
            timeout = httpx.Timeout(deadline_seconds)
            async with httpx.AsyncClient(
                timeout=timeout,
                follow_redirects=False,
                trust_env=False,
                transport=transport,
                verify=_tls(),
            ) as client:
                request = client.build_request(
                    "POST", pinned, content=body, headers=request_headers, extensions=extensions
                )
                response = await client.send(request, stream=True)
                try:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read >= max_response_bytes:
                            break  # what a receiver says back is not worth more
                finally:
                    await response.aclose()
            code = response.status_code
            return done(DELIVERED if 200 <= code < 300 else http_outcome(code), code)
    except TimeoutError:
        return done(TIMED_OUT, detail=f"no complete answer within {deadline_seconds} s")
    except httpx.TimeoutException as exc:
        return done(TIMED_OUT, detail=f"{type(exc).__name__}: {exc}")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        return done(UNREACHABLE, detail=f"{type(exc).__name__}: {exc}")


def _pin(
    url: str, address: IPAddress, headers: Mapping[str, str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The URL with its host replaced by the checked address; Host and SNI keep the name."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal + (f":{parts.port}" if parts.port else "")
    pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    shown_host = f"[{host}]" if ":" in host else host
    out = {**headers, "Host": shown_host + (f":{parts.port}" if parts.port else "")}
    extensions = {"sni_hostname": host} if parts.scheme.lower() == "https" else {}
    return pinned, out, extensions
