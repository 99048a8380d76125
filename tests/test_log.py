"""Logging set-up: JSON lines, console rendering, level filtering, secret redaction."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from hipr.observability.log import (
    REDACTED,
    configure_logging,
    get_logger,
    is_secret_key,
    resolve_level,
)

pytestmark = pytest.mark.usefixtures("logging_restored")


class TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_parse_and_carry_the_standard_fields() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    get_logger("hipr.test", peer="1.2.3.4").info("session opened", session_id=7)
    [rec] = lines(out)
    assert rec["event"] == "session opened"
    assert rec["level"] == "info"
    assert rec["logger"] == "hipr.test"
    assert rec["peer"] == "1.2.3.4"
    assert rec["session_id"] == 7
    assert rec["timestamp"].endswith("Z") and "T" in rec["timestamp"]
    assert list(rec)[:4] == ["timestamp", "level", "logger", "event"]


def test_auto_is_json_off_a_terminal_and_console_on_one() -> None:
    out = io.StringIO()
    configure_logging("info", "auto", out)
    get_logger("hipr.test").info("hello", n=1)
    assert lines(out)[0]["event"] == "hello"

    tty = TtyStream()
    configure_logging("info", "auto", tty)
    get_logger("hipr.test").info("hello", n=1)
    text = tty.getvalue()
    assert "hello" in text and "\x1b[" in text  # colours on a terminal
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    tty = TtyStream()
    configure_logging("info", "console", tty)
    get_logger("hipr.test").info("plain", n=1)
    assert "\x1b[" not in tty.getvalue() and "n=1" in tty.getvalue()


def test_console_format_is_readable() -> None:
    out = io.StringIO()
    configure_logging("info", "console", out)
    get_logger("hipr.server").warning("listening", url="tcp://x")
    text = out.getvalue()
    assert "listening" in text and "hipr.server" in text and "url=tcp://x" in text
    assert "\x1b[" not in text  # no colours off a terminal


def test_level_filter() -> None:
    out = io.StringIO()
    configure_logging("warning", "json", out)
    log = get_logger("hipr.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [r["event"] for r in lines(out)] == ["w", "e"]


def test_level_from_environment_when_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIPR_LOG_LEVEL", "DEBUG")
    out = io.StringIO()
    configure_logging(None, "json", out)
    get_logger("hipr.test").debug("visible")
    assert [r["event"] for r in lines(out)] == ["visible"]
    monkeypatch.delenv("HIPR_LOG_LEVEL")
    assert resolve_level(None) == "info"
    assert resolve_level("WARN") == "warning"


def test_bad_level_and_format() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud", "json", io.StringIO())
    with pytest.raises(ValueError, match="unknown log format"):
        configure_logging("info", "xml", io.StringIO())


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_secrets_are_redacted(fmt: str) -> None:
    out = io.StringIO()
    configure_logging("debug", fmt, out)
    log = get_logger("hipr.test", token="tok-bound-SECRET1")
    log.info(
        "hello",
        resume_token="tok-SECRET2",
        password="SECRET3",
        secret="SECRET4",
        admin_token="SECRET5",
        Token="SECRET6",
        hello={"token": "SECRET7", "nested": [{"password": "SECRET8"}], "ok": "visible"},
    )
    text = out.getvalue()
    assert "SECRET" not in text
    assert REDACTED in text and "visible" in text
    if fmt == "json":
        [rec] = lines(out)
        assert rec["token"] == rec["resume_token"] == rec["password"] == REDACTED
        assert rec["hello"] == {
            "token": REDACTED,
            "nested": [{"password": REDACTED}],
            "ok": "visible",
        }


def test_foreign_stdlib_records_go_through_the_same_pipeline() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    logging.getLogger("somelib").warning("from %s", "stdlib", extra={"token": "SECRET"})
    [rec] = lines(out)
    assert rec["event"] == "from stdlib"
    assert rec["logger"] == "somelib"
    assert rec["level"] == "warning"
    assert "SECRET" not in out.getvalue()


def test_logger_made_before_configuration_follows_it() -> None:
    early = get_logger("hipr.early", part="a")
    out = io.StringIO()
    configure_logging("info", "json", out)
    early.info("late")
    assert lines(out)[0]["part"] == "a"


def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    configure_logging("info", "json", second)
    get_logger("hipr.test").info("once")
    assert first.getvalue() == ""
    assert len(lines(second)) == 1


def test_exceptions_are_rendered_in_json() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        get_logger("hipr.test").exception("failed")
    [rec] = lines(out)
    assert "RuntimeError: kaput" in rec["exception"]


def test_is_secret_key() -> None:
    for key in ("token", "TOKEN", "resume_token", "password", "secret", "admin_token"):
        assert is_secret_key(key)
    for other in ("session_id", "tokens_used", "token_sha256", 3):
        assert not is_secret_key(other)
