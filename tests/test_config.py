"""The worker configuration: schema defaults, TOML parsing, validation and its messages."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hipr.worker.config import (
    ConfigError,
    EmulatorConfig,
    GiB,
    KiB,
    MiB,
    TlsConfig,
    WorkerConfig,
    config_reference_markdown,
    format_size,
    iter_keys,
    load_config,
    parse_size,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config" / "worker.toml"


def write(tmp_path: Path, text: str, name: str = "worker.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- sizes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64MiB", 64 * MiB),
        ("8GiB", 8 * GiB),
        ("1TiB", 1024**4),
        ("512KiB", 512 * KiB),
        ("512KB", 512_000),
        ("3MB", 3_000_000),
        ("2GB", 2_000_000_000),
        ("100B", 100),
        ("4096", 4096),
        ("64 MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("0.1KB", 100),
        (12345, 12345),
        (0, 0),
    ],
)
def test_parse_size(text: int | str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "MiB", "64XB", "64 M", "-1", "1.5B", "0.3KiB", "1e3", True, 1.5, -5, None]
)
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 1000, 1024, 64 * MiB, 8 * GiB, 3 * GiB // 2, 1024**4 * 3])
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n


# --- defaults and parsing -----------------------------------------------------------


def test_defaults() -> None:
    cfg = load_config(None)
    assert cfg == WorkerConfig()
    assert cfg.listen == ("tcp://127.0.0.1:18515",)
    assert cfg.backend == "auto"
    assert cfg.max_frame_bytes == 64 * MiB
    assert cfg.pinned_payload_bytes == 64 * MiB
    assert cfg.max_clients is None
    assert (cfg.heartbeat_interval, cfg.heartbeat_timeout) == (5.0, 15.0)
    assert (cfg.resume_grace, cfg.shutdown_timeout) == (30.0, 10.0)
    assert cfg.tenants_file is None
    assert cfg.allow_plaintext_tokens is False
    assert cfg.admin_token_sha256 is None
    assert cfg.metrics_listen is None
    assert (cfg.log_level, cfg.log_format) == ("info", "auto")
    assert cfg.tls == TlsConfig()
    assert cfg.emulator == EmulatorConfig(1, 8 * GiB, "hipr emulator")


def test_config_is_frozen() -> None:
    cfg = WorkerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.backend = "hip"  # type: ignore[misc]


def test_every_schema_field_has_a_doc() -> None:
    keys = list(iter_keys())
    assert len(keys) == 36  # isolation, runaway_grace, eight keys of issue 29, data_links
    for k in keys:
        assert k.doc, f"{k.key} has no doc"


FULL = """
listen = ["tcp://0.0.0.0:9000", "unix:///run/hipr/w.sock"]
backend = "emulator"
max_frame_bytes = "16MiB"
max_clients = 32
heartbeat_interval = 2
heartbeat_timeout = 7.5
resume_grace = 0
shutdown_timeout = 3.0
tenants_file = "tenants.toml"
allow_plaintext_tokens = true
admin_token_sha256 = "%s"
metrics_listen = "127.0.0.1:9464"
log_level = "DEBUG"
log_format = "json"

[tls]
certfile = "certs/w.pem"
keyfile = "/etc/hipr/w.key"
client_ca = "../ca.pem"
require_client_cert = true

[emulator]
device_count = 4
total_memory = "512MB"
device_name = "fake"
""" % ("ab" * 32)


def test_every_key_parsed(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FULL))
    base = tmp_path.absolute()
    assert cfg == WorkerConfig(
        listen=("tcp://0.0.0.0:9000", "unix:///run/hipr/w.sock"),
        backend="emulator",
        max_frame_bytes=16 * MiB,
        max_clients=32,
        heartbeat_interval=2.0,
        heartbeat_timeout=7.5,
        resume_grace=0.0,
        shutdown_timeout=3.0,
        tenants_file=base / "tenants.toml",
        allow_plaintext_tokens=True,
        admin_token_sha256="ab" * 32,
        metrics_listen="127.0.0.1:9464",
        log_level="debug",
        log_format="json",
        tls=TlsConfig(
            certfile=base / "certs" / "w.pem",
            keyfile=Path("/etc/hipr/w.key"),
            client_ca=base.parent / "ca.pem",
            require_client_cert=True,
        ),
        emulator=EmulatorConfig(device_count=4, total_memory=512_000_000, device_name="fake"),
    )
    assert isinstance(cfg.heartbeat_interval, float)


def test_listen_may_be_one_string(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'listen = "unix:///tmp/x.sock"'))
    assert cfg.listen == ("unix:///tmp/x.sock",)


def test_integer_size_accepted(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "max_frame_bytes = 1048576"))
    assert cfg.max_frame_bytes == MiB
    cfg = load_config(write(tmp_path, 'pinned_payload_bytes = "0"'))
    assert cfg.pinned_payload_bytes == 0  # none pinned


def test_relative_paths_resolve_against_the_file_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc" / "hipr"
    conf_dir.mkdir(parents=True)
    write(conf_dir, 'tenants_file = "tenants.toml"\n[tls]\nclient_ca = "ca/x.pem"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("../etc/hipr/worker.toml"))
    assert cfg.tenants_file == conf_dir / "tenants.toml"
    assert cfg.tls.client_ca == conf_dir / "ca" / "x.pem"
    assert cfg.tenants_file.is_absolute()


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(write(tmp_path, 'tenants_file = "~/t.toml"'))
    assert cfg.tenants_file == tmp_path / "t.toml"


# --- overrides and environment ------------------------------------------------------


def test_overrides_win_and_none_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "hip"\nlog_level = "warning"\n[emulator]\ndevice_count = 2')
    cfg = load_config(
        path,
        {
            "backend": "emulator",
            "log_level": None,
            "listen": ["unix:///tmp/a.sock"],
            "emulator.total_memory": "1GiB",
        },
    )
    assert cfg.backend == "emulator"
    assert cfg.log_level == "warning"
    assert cfg.listen == ("unix:///tmp/a.sock",)
    assert cfg.emulator == EmulatorConfig(device_count=2, total_memory=GiB)


def test_nested_overrides_and_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, {"tls": {"certfile": "a.pem", "keyfile": "a.key"}})
    assert cfg.tls.certfile == tmp_path / "a.pem"
    assert cfg.tls.keyfile == tmp_path / "a.key"


def test_dotted_override_beats_a_scalar_of_the_same_name() -> None:
    cfg = load_config(None, {"tls": "junk", "tls.certfile": "/a.pem", "tls.keyfile": "/a.key"})
    assert cfg.tls.certfile == Path("/a.pem")


def test_override_errors_name_the_command_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "hip"')
    with pytest.raises(ConfigError) as err:
        load_config(path, {"backend": "opencl"})
    assert str(err.value).startswith("command line: backend: ")
    assert err.value.key == "backend"


def test_environment_sits_between_file_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, 'log_level = "error"\nlog_format = "console"')
    env = {"HIPR_LOG_LEVEL": "debug", "HIPR_LOG_FORMAT": "json"}
    assert load_config(path, environ=env).log_level == "debug"
    assert load_config(path, environ=env).log_format == "json"
    assert load_config(path, {"log_level": "info"}, environ=env).log_level == "info"
    assert load_config(path).log_level == "error"  # not read unless passed
    with pytest.raises(ConfigError, match=r"^HIPR_LOG_LEVEL: log_level: "):
        load_config(path, environ={"HIPR_LOG_LEVEL": "loud"})


# --- errors -------------------------------------------------------------------------


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "max_frame = 10\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: unknown key 'max_frame' (known: listen, backend, ")
    assert "max_frame_bytes" in msg
    assert err.value.source == str(path)
    assert isinstance(err.value, ValueError)


def test_unknown_nested_key_is_dotted(tmp_path: Path) -> None:
    path = write(tmp_path, "[emulator]\ntotal_mem = 5\n")
    with pytest.raises(ConfigError, match=r"unknown key 'emulator\.total_mem' \(known: device_"):
        load_config(path)


def test_unknown_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'tenants'"):
        load_config(write(tmp_path, "[tenants]\na = 1\n"))


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ('backend = "opencl"', "backend", "expected one of auto, emulator, cuda, hip"),
        ("backend = 3", "backend", "expected a string"),
        ("max_frame_bytes = true", "max_frame_bytes", "expected a size"),
        ('max_frame_bytes = "lots"', "max_frame_bytes", "not a size"),
        ("max_frame_bytes = 0", "max_frame_bytes", "must be positive"),
        ("max_frame_bytes = -1", "max_frame_bytes", "cannot be negative"),
        ("pinned_payload_bytes = -1", "pinned_payload_bytes", "cannot be negative"),
        ('max_frame_bytes = "64Mb/s"', "max_frame_bytes", "not a size"),
        ('max_clients = "10"', "max_clients", "expected an integer"),
        ("max_clients = 1.5", "max_clients", "expected an integer"),
        ("max_clients = 0", "max_clients", "must be positive"),
        ('heartbeat_interval = "5s"', "heartbeat_interval", "expected a number"),
        ("heartbeat_interval = true", "heartbeat_interval", "expected a number"),
        ("heartbeat_interval = 0", "heartbeat_interval", "must be positive"),
        ("heartbeat_timeout = nan", "heartbeat_timeout", "finite"),
        ("shutdown_timeout = -1", "shutdown_timeout", "must be positive"),
        ("resume_grace = -0.5", "resume_grace", "cannot be negative"),
        ("max_hello_bytes = 0", "max_hello_bytes", "must be positive"),
        ("max_cbor_items = 0", "max_cbor_items", "must be positive"),
        ("handshake_timeout = 0", "handshake_timeout", "must be positive"),
        ("frame_timeout = -1", "frame_timeout", "must be positive"),
        ("max_pending_handshakes = 0", "max_pending_handshakes", "must be positive"),
        (
            "max_pending_handshakes_per_peer = -3",
            "max_pending_handshakes_per_peer",
            "must be positive",
        ),
        ("auth_failure_delay = -1", "auth_failure_delay", "cannot be negative"),
        ("auth_failure_max_delay = -1", "auth_failure_max_delay", "cannot be negative"),
        ("allow_plaintext_tokens = 1", "allow_plaintext_tokens", "expected true or false"),
        ("tenants_file = 5", "tenants_file", "expected a path"),
        ('tenants_file = ""', "tenants_file", "expected a path"),
        ('admin_token_sha256 = "secret"', "admin_token_sha256", "64 lowercase hex"),
        ('metrics_listen = "9464"', "metrics_listen", "HOST:PORT"),
        ('metrics_listen = "host:99999"', "metrics_listen", "HOST:PORT"),
        ('log_level = "verbose"', "log_level", "debug, info, warning, error"),
        ('log_format = "xml"', "log_format", "auto, console, json"),
        ("listen = []", "listen", "at least one URL"),
        ("listen = 5", "listen", "expected a list of strings"),
        ('listen = ["tcp://a:1", 5]', "listen[1]", "non-empty string"),
        ('listen = ["tcp://a:1", ""]', "listen[1]", "non-empty string"),
        ('listen = ["localhost:18515"]', "listen[0]", "is not a URL"),
        ('tls = "yes"', "tls", "expected a table"),
        ('[tls]\ncertfile = "a.pem"', "tls.keyfile", "set both or neither"),
        ("[tls]\nrequire_client_cert = true", "tls.client_ca", "must be set"),
        ("[tls]\nrequire_client_cert = 'yes'", "tls.require_client_cert", "true or false"),
        ("[emulator]\ntotal_memory = -1", "emulator.total_memory", "cannot be negative"),
        ('[emulator]\ntotal_memory = "8 GiBs"', "emulator.total_memory", "unknown size unit"),
        ("[emulator]\ndevice_count = 0", "emulator.device_count", "must be positive"),
        ("[emulator]\ndevice_count = 1.0", "emulator.device_count", "expected an integer"),
        ("[emulator]\ndevice_name = []", "emulator.device_name", "expected a string"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {key}: "), msg
    assert fragment in msg
    assert err.value.key == key
    assert "\n" not in msg


def test_heartbeat_timeout_must_exceed_interval(tmp_path: Path) -> None:
    path = write(tmp_path, "heartbeat_interval = 20\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: heartbeat_interval: heartbeat_timeout (15) must be greater than "
        "heartbeat_interval (20)"
    )
    with pytest.raises(ConfigError, match=r"heartbeat_timeout: .*must be greater"):
        load_config(write(tmp_path, "heartbeat_interval = 5\nheartbeat_timeout = 5\n"))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(f"{path}: no such file")):
        load_config(path)


def test_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "listen = [\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: invalid TOML: ")):
        load_config(path)


def test_unreadable_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)  # a directory


def test_config_error_without_source() -> None:
    assert str(ConfigError("plain")) == "plain"
    assert str(ConfigError("bad", source="f.toml", key="a.b")) == "f.toml: a.b: bad"


# --- the shipped example and the reference ------------------------------------------


def test_example_config_loads() -> None:
    assert load_config(EXAMPLE) == WorkerConfig()


def test_example_documents_every_key_with_its_default(tmp_path: Path) -> None:
    """Uncommenting every ``# key = value`` line of the example still loads, and the
    example names every key of the schema, each in its table."""
    text = EXAMPLE.read_text()
    table = ""
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        if m := re.match(r"^\[(\w+)\]", line):
            table = m.group(1) + "."
        if m := re.match(r"^#? ?(\w+) = ", line):
            seen.add(table + m.group(1))
            line = line.removeprefix("# ")
        lines.append(line)
    assert seen == {k.key for k in iter_keys()}
    (tmp_path / "config").mkdir()
    uncommented = write(tmp_path / "config", "\n".join(lines))
    cfg = load_config(uncommented)
    assert cfg.max_clients == 64
    assert cfg.tls.certfile == tmp_path / "config" / "certs" / "worker.pem"
    # Commented values show the defaults, except where a default is "unset".
    defaults = WorkerConfig()
    assert cfg.max_frame_bytes == defaults.max_frame_bytes
    assert cfg.heartbeat_timeout == defaults.heartbeat_timeout
    assert cfg.emulator == defaults.emulator
    assert cfg.log_level == defaults.log_level


def test_reference_markdown_lists_every_key() -> None:
    md = config_reference_markdown()
    lines = md.strip().splitlines()
    assert lines[0] == "| Key | Type | Default | Description |"
    keys = [k.key for k in iter_keys()]
    assert len(lines) == 2 + len(keys)
    for key, line in zip(keys, lines[2:], strict=True):
        assert line.startswith(f"| `{key}` |")
        assert line.count(" | ") == 3 or "\\|" in line
    assert '`"64MiB"`' in md
    assert '| `emulator.total_memory` | size | `"8GiB"` |' in md
    assert "| `max_clients` | integer (optional) | unset |" in md


def test_runaway_grace_is_read_and_must_be_positive(tmp_path: Path) -> None:
    assert load_config(None).runaway_grace == 5.0
    assert load_config(write(tmp_path, "runaway_grace = 0.5")).runaway_grace == 0.5
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match="runaway_grace"):
            load_config(write(tmp_path, f"runaway_grace = {bad}"))
