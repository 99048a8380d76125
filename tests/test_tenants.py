"""Tenants file parsing, token authentication, and the request-rate bucket."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hipr.errors import AuthError
from hipr.sessions.limits import TokenBucket
from hipr.worker.config import ConfigError
from hipr.worker.tenants import load_tenants, new_token, token_hash

ALICE = new_token()
BOB = new_token()
OLD = new_token()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        f"""
[tenants.alice]
tokens = ["{token_hash(ALICE)}"]
revoked_tokens = ["{token_hash(OLD)}"]
max_device_memory = "1MiB"
max_streams = 2
max_request_rate = 10.5

[tenants.bob]
tokens = ["{token_hash(BOB)}"]
unix_uids = [4242]
cert_subjects = ["bob-laptop"]
""",
    )


def test_new_tokens_are_long_random_and_url_safe() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        body = token.removeprefix("hipr_")
        assert len(body) >= 43  # 32 bytes of randomness, base64url
        assert set(body) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_authentication_by_token_uid_and_certificate(tenants_file: Path) -> None:
    registry = load_tenants(tenants_file)
    assert registry.authenticate(ALICE).name == "alice"
    assert registry.authenticate(BOB).name == "bob"
    assert registry.authenticate(None, unix_uid=4242).name == "bob"
    assert registry.authenticate(None, cert_subject="bob-laptop").name == "bob"
    alice = registry.get("alice")
    assert alice is not None
    assert alice.quotas.max_device_memory == 1 << 20
    assert alice.quotas.max_streams == 2
    assert alice.quotas.max_request_rate == 10.5


@pytest.mark.parametrize(
    ("token", "uid", "message"),
    [
        (None, None, "requires a token"),
        ("", 1000, "requires a token"),
        ("hipr_wrong", None, "not valid"),
        (OLD, None, "revoked"),
    ],
    ids=["none", "empty-with-uid", "unknown", "revoked"],  # OLD is random: ids keep -n stable
)
def test_refusals_say_which_and_never_echo_the_token(
    tenants_file: Path, token: str | None, uid: int | None, message: str
) -> None:
    registry = load_tenants(tenants_file)
    with pytest.raises(AuthError) as err:
        registry.authenticate(token, unix_uid=uid)
    assert message in err.value.message
    if token:
        assert token not in str(err.value)


def test_no_file_means_one_anonymous_tenant() -> None:
    registry = load_tenants(None)
    assert registry.anonymous
    assert registry.authenticate(None).name == "anonymous"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[tenants.a]\ntokens = ["hipr_plaintext"]', "never put a token itself"),
        ("[tenants.a]\nmax_streams = -1", "must be positive"),
        ('[tenants.a]\nmax_device_memory = "lots"', "not a size"),
        ("[tenants.a]\nmax_stream = 1", "tenants.a.max_stream: unknown key"),
        ("[tenants.a]\nmax_streams = 1.5", "whole number"),
        ("[other]\nx = 1", "unknown key"),
        ("[tenants]", "at least one"),
        ('[tenants."bad name!"]', "tenant names"),
        ("[tenants.a]\nunix_uids = [-3]", "non-negative"),
    ],
)
def test_bad_files_name_the_key_and_file(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_tenants(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_one_token_hash_cannot_belong_to_two_tenants(tmp_path: Path) -> None:
    digest = token_hash(ALICE)
    path = write(
        tmp_path, f'[tenants.a]\ntokens = ["{digest}"]\n[tenants.b]\ntokens = ["{digest}"]'
    )
    with pytest.raises(ConfigError, match="also belongs to a"):
        load_tenants(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_tenants(tmp_path / "nope.toml")


def test_token_bucket_burst_then_refill() -> None:
    bucket = TokenBucket(rate=1000, burst=5)
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    time.sleep(0.01)
    assert bucket.take()


def test_token_bucket_takes_all_or_none() -> None:
    """A fused request's two requests: both spent, or neither (nothing left taken)."""
    bucket = TokenBucket(rate=1e-6, burst=5)
    assert [bucket.take_all(2) for _ in range(3)] == [True, True, False]
    assert bucket.take()  # the fifth token was not spent by the refusal
    assert not bucket.take()
    bucket.give_back(2)
    assert bucket.take_all(2)


def test_max_kernel_seconds_is_a_positive_number(tmp_path: Path) -> None:
    from hipr.worker.tenants import load_tenants

    path = tmp_path / "t.toml"
    path.write_text("[tenants.a]\ntokens = []\nmax_kernel_seconds = 2.5\n")
    assert load_tenants(path).tenants["a"].quotas.max_kernel_seconds == 2.5
    path.write_text("[tenants.a]\ntokens = []\nmax_kernel_seconds = 0\n")
    with pytest.raises(ConfigError, match="max_kernel_seconds"):
        load_tenants(path)
