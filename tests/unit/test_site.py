"""builder/image/site.py: site options from pip's real configuration (a pip config file written
by the test, named by PIP_CONFIG_FILE; pip itself reads it) and from explicit flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError
from builder.image.site import SiteOptions, pip_config


@pytest.fixture
def site_dir(tmp_path):
    """tmp_path with ca.pem, other.pem, wheels/ (one wheel, one stray file), empty/."""
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n")
    (tmp_path / "other.pem").write_text("other\n")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "demo-1.0-py3-none-any.whl").write_bytes(b"PK")
    (tmp_path / "wheels" / "README.txt").write_text("not a wheel\n")
    (tmp_path / "empty").mkdir()
    return tmp_path


def pip_env(config_file: Path, **extra) -> dict[str, str]:
    """This environment without PIP_* variables, plus PIP_CONFIG_FILE and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(config_file)
    env.update(extra)
    return env


def write_conf(path: Path, **options: str) -> Path:
    path.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in options.items()))
    return path


def test_pip_config_is_read_from_pip(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    config = pip_config(env=pip_env(conf))
    assert config["global.cert"] == f"{site_dir}/ca.pem"
    assert config["global.find-links"] == f"{site_dir}/wheels"


def test_detect_from_pip_config_file(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    site = SiteOptions.detect(env=pip_env(conf))
    assert site == SiteOptions(ca_bundle=site_dir / "ca.pem", wheel_dir=site_dir / "wheels", base_override=None)
    assert site.notes == ()


def test_detect_skips_missing_cert_and_missing_folder(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "gone.pem", **{"find-links": site_dir / "gone"})
    site = SiteOptions.detect(env=pip_env(conf))
    assert (site.ca_bundle, site.wheel_dir) == (None, None)
    assert site.notes == (
        f"pip config global.cert='{site_dir}/gone.pem' ignored: not an existing local file",
        f"pip config global.find-links: find-links '{site_dir}/gone' ignored: not an existing folder",
    )


def test_environment_variables_override_the_file(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    env = pip_env(conf, PIP_CERT=str(site_dir / "other.pem"), PIP_FIND_LINKS=str(site_dir / "empty"))
    site = SiteOptions.detect(env=env)
    assert site.ca_bundle == site_dir / "other.pem"
    assert site.wheel_dir == site_dir / "empty"
    assert site.notes == (f"wheel folder {site_dir}/empty holds no *.whl files",)


def test_url_find_links_is_ignored_with_a_note(site_dir):
    links = f"https://example.org/wheels file://{site_dir}/wheels {site_dir}/empty"
    conf = write_conf(site_dir / "pip.conf", **{"find-links": links})
    site = SiteOptions.detect(env=pip_env(conf))
    assert site.wheel_dir == site_dir / "wheels"
    assert site.notes == (
        "pip config global.find-links: find-links 'https://example.org/wheels' ignored: a URL, not a local folder",
        f"pip config global.find-links: find-links '{site_dir}/empty' ignored: only the first folder is used",
    )


def test_only_url_find_links_gives_no_wheel_dir(site_dir):
    conf = write_conf(site_dir / "pip.conf", **{"find-links": "https://example.org/wheels"})
    site = SiteOptions.detect(env=pip_env(conf))
    assert site.wheel_dir is None


def test_explicit_flags_override_detection(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    site = SiteOptions.detect(
        ca_cert=site_dir / "other.pem", wheels=site_dir / "empty", base="envbuild-test/base:1", env=pip_env(conf)
    )
    assert site == SiteOptions(ca_bundle=site_dir / "other.pem", wheel_dir=site_dir / "empty", base_override="envbuild-test/base:1")


def test_no_detect_ignores_pip(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    env = pip_env(conf, PIP_CERT=str(site_dir / "other.pem"))
    assert SiteOptions.detect(no_detect=True, env=env) == SiteOptions()
    assert SiteOptions.detect(no_detect=False, env=env).ca_bundle == site_dir / "other.pem"


def test_explicit_missing_ca_cert_names_option_and_value(site_dir):
    with pytest.raises(EnvbuildError) as info:
        SiteOptions.detect(ca_cert="/nonexistent/ca.pem", no_detect=True)
    assert str(info.value) == "--ca-cert: '/nonexistent/ca.pem' no such file"
    assert info.value.exit_code == 2
    with pytest.raises(EnvbuildError) as info:
        SiteOptions.detect(ca_cert=site_dir / "wheels", no_detect=True)  # a folder, not a file
    assert str(info.value) == f"--ca-cert: '{site_dir}/wheels' no such file"


def test_explicit_missing_wheels_names_option_and_value(site_dir):
    with pytest.raises(EnvbuildError) as info:
        SiteOptions.detect(wheels="/nonexistent/wheels", no_detect=True)
    assert str(info.value) == "--wheels: '/nonexistent/wheels' no such folder"
    assert info.value.exit_code == 2
    with pytest.raises(EnvbuildError) as info:
        SiteOptions.detect(wheels=site_dir / "ca.pem", no_detect=True)  # a file, not a folder
    assert str(info.value) == f"--wheels: '{site_dir}/ca.pem' no such folder"


def test_unrunnable_pip_is_a_note(site_dir):
    site = SiteOptions.detect(env=pip_env(site_dir / "pip.conf"), python=str(site_dir / "no-python"))
    assert (site.ca_bundle, site.wheel_dir) == (None, None)
    assert len(site.notes) == 1 and site.notes[0].startswith("could not read pip's configuration: ")


def test_detect_uses_this_interpreter_by_default(site_dir, monkeypatch):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem")
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert SiteOptions.detect().ca_bundle == site_dir / "ca.pem"


def test_deferred_detection_reads_pip_only_when_completed(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "ca.pem", **{"find-links": site_dir / "wheels"})
    # an interpreter that cannot run: reading pip's configuration now would leave a note
    site = SiteOptions.detect(env=pip_env(conf), python=str(site_dir / "no-python"), deferred=True)
    assert site == SiteOptions(pending=True) and site.notes == ()
    done = site.complete(env=pip_env(conf))
    assert done == SiteOptions(ca_bundle=site_dir / "ca.pem", wheel_dir=site_dir / "wheels")
    assert done.complete() is done  # nothing pending any more


def test_deferred_detection_keeps_explicit_values_and_checks_them_now(site_dir):
    conf = write_conf(site_dir / "pip.conf", cert=site_dir / "other.pem", **{"find-links": site_dir / "empty"})
    site = SiteOptions.detect(wheels=site_dir / "wheels", base="mirror/debian:12", env=pip_env(conf), deferred=True)
    assert (site.wheel_dir, site.ca_bundle, site.base_override, site.pending) == (
        site_dir / "wheels", None, "mirror/debian:12", True)
    done = site.complete(env=pip_env(conf))
    assert (done.wheel_dir, done.ca_bundle, done.base_override, done.pending) == (
        site_dir / "wheels", site_dir / "other.pem", "mirror/debian:12", False)
    with pytest.raises(EnvbuildError) as info:
        SiteOptions.detect(wheels=site_dir / "gone", deferred=True)
    assert str(info.value) == f"--wheels: '{site_dir}/gone' no such folder"
    # nothing to detect: not pending
    both = SiteOptions.detect(ca_cert=site_dir / "ca.pem", wheels=site_dir / "wheels", deferred=True)
    assert both.pending is False
    assert SiteOptions.detect(no_detect=True, deferred=True).pending is False
