"""URL parsing: the generic shape every transport builds on."""

from __future__ import annotations

import pytest

from hipr.transports import parse_url
from hipr.transports.base import TransportUrl, format_host_port, query_values


def test_tcp_url() -> None:
    url = parse_url("tcp://10.0.0.2:18515")
    assert url == TransportUrl("tcp", "10.0.0.2", 18515, "", None, {}, "tcp://10.0.0.2:18515")
    assert url.host_port("127.0.0.1", 1) == ("10.0.0.2", 18515)


def test_defaults_filled_by_transport() -> None:
    url = parse_url("tcp://")
    assert (url.host, url.port) == ("", None)
    assert url.host_port("127.0.0.1", 18515) == ("127.0.0.1", 18515)


def test_ipv6_brackets_removed() -> None:
    url = parse_url("tcp://[::1]:18515")
    assert (url.host, url.port) == ("::1", 18515)
    assert format_host_port(url.host, 18515) == "[::1]:18515"


def test_unix_url() -> None:
    url = parse_url("unix:///run/hipr/worker%20a.sock")
    assert (url.scheme, url.host, url.path) == ("unix", "", "/run/hipr/worker a.sock")


def test_ssh_url_with_user_port_and_query() -> None:
    url = parse_url(
        "SSH://me@gpu01:2222/run/hipr/worker.sock?identity=~/.ssh/k&option=A=1&option=B=2"
    )
    assert url.scheme == "ssh"
    assert (url.user, url.host, url.port, url.path) == (
        "me",
        "gpu01",
        2222,
        "/run/hipr/worker.sock",
    )
    assert url.query == {"identity": "~/.ssh/k", "option": "B=2"}
    assert query_values(url, "option") == ["A=1", "B=2"]
    assert str(url) == url.raw


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:18515", "expected scheme://"),
        ("", "expected scheme://"),
        ("1tcp://x", "bad scheme"),
        ("tcp://host:99999", "out of range"),
        ("tcp://host:port", "malformed transport URL"),
        ("tcp://host:", "empty port"),
        ("ssh://me:secret@host/x", "passwords do not belong"),
        ("tcp://host#frag", "unexpected '#frag'"),
        ("tcp://[::1:18515", "malformed transport URL"),
        ("tls://host?novalue", "bad query"),
    ],
)
def test_malformed_urls_are_clear(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_url(url)


def test_not_a_string() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_url(b"tcp://x")  # type: ignore[arg-type]
