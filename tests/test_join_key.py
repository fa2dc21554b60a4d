"""The join key file of a plaintext `fednet server` (protocol/join_key.py)."""
from __future__ import annotations

import stat

import pytest

from fednet.errors import ConfigError
from fednet.protocol import join_key


def test_the_server_draws_a_key_once_and_reads_it_back(tmp_path):
    path = tmp_path / "run" / "join.key"
    key = join_key.ensure(path)
    assert len(key) == 32 and path.read_text().strip() == key.hex()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the run's secret: the owner's alone
    assert join_key.ensure(path) == key == join_key.read(path)  # a resumed server: the same key
    assert join_key.wait_for(path, 0.1) == key
    assert join_key.ensure(tmp_path / "other.key") != key


@pytest.mark.parametrize("text", ["", "xyz", "ab" * 31, "ab" * 33])
def test_a_file_that_is_no_join_key_is_one_error_naming_the_option(tmp_path, text):
    path = tmp_path / "join.key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=r"--join-key .*join.key: not a join key"):
        join_key.read(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_key_file_others_can_read_or_change_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "join.key"
    key = join_key.ensure(path)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=rf"other users can read or change it \(mode "
                                          rf"0{mode:o}\).*`chmod 600 {path}`"):
        join_key.ensure(path)
    path.chmod(0o600)
    assert join_key.read(path) == key


def test_a_key_given_where_its_file_belongs_is_refused_not_made_a_file_name(tmp_path,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (join_key.ensure, join_key.read, lambda p: join_key.wait_for(p, 0.1)):
        with pytest.raises(ConfigError, match="holds a key itself, not the path of a key file"):
            call("ab" * 32)
    assert list(tmp_path.iterdir()) == []


def test_clients_wait_for_the_key_and_then_say_where_it_comes_from(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file after 0.2s; `fednet server` writes it"):
        join_key.wait_for(tmp_path / "missing.key", 0.2)
    with pytest.raises(ConfigError, match="cannot read it"):
        join_key.read(tmp_path)  # a folder
