"""API keys: where they come from, how they are compared, and the start-up warning when there are none."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from starlette.datastructures import Headers

from infinity.api.auth import matches, presented_key
from infinity.cli import build_parser, settings_from, warn_if_open
from infinity.errors import StartupError
from infinity.settings import Settings


def keys_from(argv: list[str], environ: dict[str, str]) -> tuple[str, ...]:
    return settings_from(build_parser().parse_args(["serve", "/model", *argv]), environ).api_keys


def test_keys_come_from_flags_variables_and_files(tmp_path: Path) -> None:
    secret = tmp_path / "keys"
    secret.write_text("from-file-1\n\n  from-file-2  \n")
    assert keys_from(["--api-key", "a", "--api-key", "b"], {}) == ("a", "b")
    assert keys_from([], {"INFINITY_API_KEY": "a, b,"}) == ("a", "b")
    assert keys_from(["--api-key", "flag"], {"INFINITY_API_KEY": "env"}) == ("flag",)  # the flag wins
    assert keys_from([], {"INFINITY_API_KEY_FILE": str(secret)}) == ("from-file-1", "from-file-2")
    assert keys_from(["--api-key", "a", "--api-key-file", str(secret)], {}) == ("a", "from-file-1", "from-file-2")
    assert keys_from([], {}) == ()
    with pytest.raises(StartupError, match="cannot read the API key file"):
        keys_from(["--api-key-file", str(tmp_path / "missing")], {})
    with pytest.raises(StartupError, match="API key"):
        keys_from(["--api-key", "has space"], {})


def test_a_key_is_read_from_bearer_or_api_key_headers() -> None:
    assert presented_key(Headers({"authorization": "Bearer k"}).get) == "k"
    assert presented_key(Headers({"authorization": "bearer  k "}).get) == "k"
    assert presented_key(Headers({"authorization": "Basic k"}).get) is None
    assert presented_key(Headers({"api-key": "k"}).get) == "k"
    assert presented_key(Headers({}).get) is None


def test_only_a_configured_key_matches() -> None:
    keys = (b"first", b"second")
    assert matches("first", keys) and matches("second", keys)
    for wrong in ("firs", "first ", "", None, "third"):
        assert not matches(wrong, keys)


def test_an_open_server_on_a_public_address_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="infinity"):
        warn_if_open(Settings(host="0.0.0.0"))
        warn_if_open(Settings(host="127.0.0.1"))
        warn_if_open(Settings(host="::1"))
        warn_if_open(Settings(host="localhost"))
        warn_if_open(Settings(host="0.0.0.0", api_keys=("k",)))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "no API key is set and the server listens on 0.0.0.0"]
