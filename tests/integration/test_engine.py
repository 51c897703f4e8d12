"""builder/image/engine.py, buildkit.py and probecheck.py against the real Docker engine:
connecting, finding a BuildKit client, building (failure keeps no tag), probing in
throwaway containers (the agent folder bind-mounted), cleanup by label."""

from __future__ import annotations

import uuid

import docker.errors
import pytest

from builder.core.errors import EnvbuildError, Unreachable
from builder.image import engine, probecheck

from fixtures_engine import TEST_SESSION_LABEL, write_script


def test_connect_to_running_engine(docker_client):
    client = engine.connect()
    try:
        assert client.ping() is True
        assert client.sdk.api.base_url == docker_client.sdk.api.base_url
    finally:
        client.close()


# --------------------------------------------------------------------------- build


FAILING = """\
FROM {base}
RUN echo step-one
RUN echo first-line && echo second-line >&2 && exit {code}
"""


def leftover_tags(client, repo):
    return sorted(t for img in client.sdk.images.list(name=repo) for t in img.tags)


def test_failing_build_reports_step_and_leaves_no_tag(docker_client, bootstrap_image, session_labels, test_session_id, tmp_path):
    (tmp_path / "Dockerfile").write_text(FAILING.format(base=bootstrap_image, code=7))
    repo = f"envbuild-test/fail-{test_session_id}"
    lines = []
    with pytest.raises(engine.BuildFailed) as info:
        docker_client.build(tmp_path, f"{repo}:1", labels=session_labels, on_line=lines.append)
    err = info.value
    assert err.exit_code == 2
    assert err.step == "[3/3] RUN echo first-line && echo second-line >&2 && exit 7"
    summary, _, output = str(err).partition(" | output: ")
    assert summary == (
        f"{tmp_path / 'Dockerfile'}: docker build of {repo}:1 failed at step "
        "[3/3] RUN echo first-line && echo second-line >&2 && exit 7: executor failed running "
        "[/bin/sh -c echo first-line && echo second-line >&2 && exit 7]: exit code: 7"
    )
    assert "\n" not in str(err) and "first-line" in output and "second-line" in output
    # the failing step's own output (stdout and stderr, in either order), not the earlier step's
    output = [ln.split(" ", 2)[2] for ln in err.lines if ln.startswith("#") and ln.split(" ")[1][:1].isdigit()]
    assert sorted(output) == ["first-line", "second-line"]
    assert "step-one" not in "\n".join(err.lines)
    assert any(ln.startswith("#") for ln in lines)  # lines were streamed
    assert leftover_tags(docker_client, repo) == []


def test_passing_build_is_tagged_with_labels(docker_client, bootstrap_image, session_labels, test_session_id, tmp_path):
    (tmp_path / "Dockerfile").write_text(FAILING.format(base=bootstrap_image, code=0))
    repo = f"envbuild-test/pass-{test_session_id}"
    image_id = docker_client.build(tmp_path, f"{repo}:1", labels={**session_labels, "x.y": "z"})
    image = docker_client.sdk.images.get(f"{repo}:1")
    assert image.id == image_id and image_id.startswith("sha256:")
    assert image.labels["x.y"] == "z"
    assert leftover_tags(docker_client, repo) == [f"{repo}:1"]  # no temporary tag left


def test_build_secret_must_exist(docker_client, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(EnvbuildError) as info:
        docker_client.build(tmp_path, "envbuild-test/none:1", secrets={"pip_ca": tmp_path / "nope.pem"})
    assert str(info.value) == f"secret pip_ca: '{tmp_path / 'nope.pem'}' no such file"


# --------------------------------------------------------------------------- probe


def probe_containers(client, test_session_id):
    return client.sdk.containers.list(all=True, filters={"label": f"{TEST_SESSION_LABEL}={test_session_id}"})


def test_run_probe_parses_json_and_removes_container(docker_client, python_image, session_labels, test_session_id, tmp_path):
    write_script(
        tmp_path / "probe.py",
        """\
        import json, os, platform, sys
        print(json.dumps({"argv0": sys.argv[0], "python": platform.python_version(),
                          "writable": os.access(sys.argv[0], os.W_OK)}))
        """,
    )
    doc = probecheck.run_probe(docker_client, python_image, tmp_path, labels=session_labels)
    assert doc == {"argv0": "/opt/envbuild/probe.py", "python": "3.11.2", "writable": False}
    assert probe_containers(docker_client, test_session_id) == []


def test_run_probe_failure_is_reported_and_container_removed(docker_client, python_image, session_labels, test_session_id, tmp_path):
    write_script(
        tmp_path / "probe.py",
        """\
        import sys
        print("partial")
        sys.exit("boom: no torch here")
        """,
    )
    with pytest.raises(EnvbuildError) as info:
        probecheck.run_probe(docker_client, python_image, tmp_path, labels=session_labels)
    assert info.value.exit_code == 3
    assert str(info.value) == f"image: {python_image!r} probe exited with code 1: boom: no torch here"
    assert probe_containers(docker_client, test_session_id) == []


def test_run_probe_rejects_non_json(docker_client, python_image, session_labels, test_session_id, tmp_path):
    write_script(tmp_path / "probe.py", 'print("hello")\n')
    with pytest.raises(EnvbuildError) as info:
        probecheck.run_probe(docker_client, python_image, tmp_path, labels=session_labels)
    assert info.value.exit_code == 3
    assert str(info.value) == f"image: {python_image!r} probe printed no JSON object: 'hello'"
    assert probe_containers(docker_client, test_session_id) == []


def test_run_probe_timeout_is_unreachable(docker_client, python_image, session_labels, test_session_id, tmp_path):
    write_script(tmp_path / "probe.py", "import time\ntime.sleep(30)\n")
    with pytest.raises(Unreachable) as info:
        probecheck.run_probe(docker_client, python_image, tmp_path, labels=session_labels, timeout_s=2)
    assert str(info.value) == f"image: {python_image!r} probe did not finish within 2 s"
    assert probe_containers(docker_client, test_session_id) == []


def test_run_probe_unknown_image(docker_client, tmp_path):
    write_script(tmp_path / "probe.py", "print('{}')\n")
    with pytest.raises(EnvbuildError) as info:
        probecheck.run_probe(docker_client, "envbuild-test/no-such-image:0", tmp_path)
    assert str(info.value) == "image: 'envbuild-test/no-such-image:0' no such image"


def test_run_probe_needs_the_module_in_the_agent_folder(docker_client, python_image, tmp_path):
    with pytest.raises(EnvbuildError) as info:
        probecheck.run_probe(docker_client, python_image, tmp_path)
    assert (info.value.exit_code, str(info.value)) == (2, f"probe: '{tmp_path}' no module probe there")
    (tmp_path / "probe").mkdir()  # the passing twin: a package, as builder/agent/probe/ is
    write_script(tmp_path / "probe" / "__main__.py", "import sys; print('{\"argv0\": \"%s\"}' % sys.argv[0])\n")
    assert probecheck.run_probe(docker_client, python_image, tmp_path) == {"argv0": "/opt/envbuild/probe/__main__.py"}


# --------------------------------------------------------------------------- labels


def test_image_labels(docker_client, bootstrap_image):
    assert docker_client.image(bootstrap_image).labels == {
        "envbuild.bootstrap.mirror": "http://deb.debian.org/debian",
        "envbuild.bootstrap.stands-for": "debian:bookworm-slim",
        "envbuild.bootstrap.suite": "bookworm",
    }
    with pytest.raises(EnvbuildError) as info:
        docker_client.image("envbuild-test/no-such-image:0")
    assert str(info.value) == "image: 'envbuild-test/no-such-image:0' no such image"


def test_remove_by_label_removes_only_matching(docker_client, bootstrap_image, session_labels, test_session_id):
    doomed = {**session_labels, "envbuild.test-rm": uuid.uuid4().hex}
    kept = {**session_labels, "envbuild.test-rm": "keep-" + uuid.uuid4().hex}
    made = {}
    for name, labels in (("doomed", doomed), ("kept", kept)):
        c = docker_client.sdk.containers.create(bootstrap_image, ["true"], labels=labels)
        n = docker_client.sdk.networks.create(f"envbuild-test-{name}-{test_session_id}", labels=labels)
        i = c.commit(repository=f"envbuild-test/rm-{name}", tag=test_session_id, conf={"Labels": labels})
        made[name] = (c.id, n.id, i.id)

    counts = docker_client.remove_by_label(f"envbuild.test-rm={doomed['envbuild.test-rm']}")

    assert counts == {"containers": 1, "networks": 1, "images": 1}
    c_id, n_id, i_id = made["doomed"]
    with pytest.raises(docker.errors.NotFound):
        docker_client.sdk.containers.get(c_id)
    with pytest.raises(docker.errors.NotFound):
        docker_client.sdk.networks.get(n_id)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.sdk.images.get(i_id)
    c_id, n_id, i_id = made["kept"]
    assert docker_client.sdk.containers.get(c_id).labels["envbuild.test-rm"] == kept["envbuild.test-rm"]
    assert docker_client.sdk.networks.get(n_id).attrs["Labels"]["envbuild.test-rm"] == kept["envbuild.test-rm"]
    assert docker_client.sdk.images.get(i_id).labels["envbuild.test-rm"] == kept["envbuild.test-rm"]
    # the kept ones go with the session: they carry its label


def test_remove_by_label_reports_an_image_in_use(docker_client, bootstrap_image, session_labels, test_session_id):
    key, value = "envbuild.test-rm", uuid.uuid4().hex
    seed = docker_client.sdk.containers.create(bootstrap_image, ["true"], labels=session_labels)
    try:
        image = seed.commit(repository="envbuild-test/rm-busy", tag=test_session_id, conf={"Labels": {**session_labels, key: value}})
    finally:
        seed.remove(force=True)
    # a running container of that image, which does not match the filter itself
    user = docker_client.sdk.containers.run(image.id, ["sleep", "60"], detach=True, labels={**session_labels, key: "other"})
    try:
        with pytest.raises(EnvbuildError) as info:
            docker_client.remove_by_label(f"{key}={value}")
        msg = str(info.value)
        assert msg.startswith(f"label: '{key}={value}' could not remove 1 image(s) ({image.id[7:19]}: ")
        assert "being used by running container" in msg
        assert msg.endswith("; the rest was removed")
        assert docker_client.sdk.images.get(image.id).id == image.id
    finally:
        user.remove(force=True)
    assert docker_client.remove_by_label(f"{key}={value}") == {"containers": 0, "networks": 0, "images": 1}


# --------------------------------------------------------------------------- stale networks


def test_stale_networks_are_only_those_past_their_deadline_without_containers(docker_client, bootstrap_image,
                                                                                 session_labels, test_session_id):
    """A network of a run killed with SIGKILL (deadline passed, no container) is listed
    and removed; its twins are kept: one whose deadline is to come, one past its deadline
    that still has a container, one without a deadline label."""
    case = {**session_labels, "envbuild.test-case": uuid.uuid4().hex}
    only_case = f"envbuild.test-case={case['envbuild.test-case']}"
    now = 1_800_000_000.0
    made = {}
    for name, deadline in (("stale", now - 1), ("future", now + 60), ("busy", now - 1), ("nolabel", None)):
        labels = {**case, **engine.run_labels(f"{name}{test_session_id}")}
        if deadline is not None:
            labels[engine.DEADLINE_LABEL] = engine.deadline_label(deadline)
        made[name] = docker_client.sdk.networks.create(f"envbuild-test-{name}-{test_session_id}", labels=labels)
    busy = docker_client.sdk.containers.run(bootstrap_image, ["sleep", "60"], labels=case, detach=True,
                                        network=made["busy"].name)
    try:
        assert made["stale"].attrs["Labels"][engine.DEADLINE_LABEL] == "2027-01-15T07:59:59Z"
        stale = docker_client.stale_networks(now=now, label_filter=only_case)
        assert stale == [{"name": f"envbuild-test-stale-{test_session_id}", "id": made["stale"].id,
                          "run": f"stale{test_session_id}", "deadline": "2027-01-15T07:59:59Z"}]
        assert docker_client.remove_stale_networks(now=now, label_filter=only_case) == stale
        left = sorted(n.name for n in docker_client.sdk.networks.list(filters={"label": only_case}))
        assert left == sorted(f"envbuild-test-{n}-{test_session_id}" for n in ("future", "busy", "nolabel"))
        # once the busy one's container is gone, it is stale too
        busy.remove(force=True)
        assert [n["name"] for n in docker_client.stale_networks(now=now, label_filter=only_case)] == [
            f"envbuild-test-busy-{test_session_id}"]
    finally:
        docker_client.remove_by_label(only_case)


def test_image_env(docker_client, python_image):
    env = docker_client.image(python_image).env()
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    with pytest.raises(EnvbuildError) as info:
        docker_client.image("envbuild-test/no-such-image:0").env()
    assert str(info.value) == "image: 'envbuild-test/no-such-image:0' no such image"


def test_run_probe_output_is_bounded(docker_client, python_image, session_labels, test_session_id, tmp_path,
                                     monkeypatch):
    monkeypatch.setattr(probecheck, "MAX_PROBE_OUTPUT", 1000)
    case = {**session_labels, "envbuild.test-case": uuid.uuid4().hex}
    write_script(tmp_path / "probe.py", 'print("{" + " " * 5000 + "}")\n')
    with pytest.raises(EnvbuildError) as info:
        probecheck.run_probe(docker_client, python_image, tmp_path, labels=case)
    assert info.value.exit_code == 3
    assert str(info.value) == f"image: {python_image!r} probe printed more than 1000 bytes"
    write_script(tmp_path / "deep.py", 'print("[" * 100 + "]" * 100)\n')
    with pytest.raises(EnvbuildError, match="probe printed no JSON object"):
        probecheck.run_probe(docker_client, python_image, tmp_path, module="deep", labels=case)
    write_script(tmp_path / "small.py", 'print("{}")\n')  # the passing twin
    assert probecheck.run_probe(docker_client, python_image, tmp_path, module="small", labels=case) == {}
    assert docker_client.sdk.containers.list(all=True, filters={"label": f"envbuild.test-case={case['envbuild.test-case']}"}) == []
