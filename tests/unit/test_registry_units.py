"""The engine-free tests of tests/integration/test_registry.py: builder/publish (push, pull, store, hardware) and builder/oci (client, referrers) against a real
registry, through ``envbuild push``/``pull`` and their functions."""

from __future__ import annotations

import pytest

from builder.core.errors import EnvbuildError, ExitCode
from builder.oci import client as oci
from builder.oci import referrers
from builder.publish import hardware, naming

GPU = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
       "pci_bus_id": "00000000:18:00.0", "memory_total_bytes": 85520809984}


def test_check_hardware_rules():
    cpu_cert = {"lock": {"cuda": None, "driver": {"min": None}}, "probe": {}}
    assert hardware.check_hardware(cpu_cert, {"driver": None, "gpus": [GPU]}) == []
    gpu_cert = {"lock": {"cuda": "12.8", "driver": {"min": "570.26"}}, "backend": {"used": "gloo"},
                "probe": {"0": {"gpus": []}}}
    [issue] = hardware.check_hardware(gpu_cert, {"driver": "580.65.06", "gpus": [GPU]})
    assert "covers no GPU (certified with gloo on CPUs)" in issue


def test_references_parse():
    r = naming.parse_target("cpu-torch2", "reg.example:5000")
    assert str(r) == "reg.example:5000/envbuild/cpu-torch2:certified"
    r = naming.parse_target("reg.example:5000/a/b@sha256:" + "0" * 64, None)
    assert (r.host, r.repository, r.tag, r.digest) == ("reg.example:5000", "a/b", None, "sha256:" + "0" * 64)
    assert naming.parse_target("team/x:1.0", "h:1").name == "h:1/team/x"
    with pytest.raises(EnvbuildError) as e:
        naming.parse_target("cpu-torch2", None)
    assert e.value.exit_code == ExitCode.USAGE
    with pytest.raises(EnvbuildError):
        naming.parse_ref("h:1/Bad Repo", None)
    assert oci.is_loopback("127.0.0.1:5000") and oci.is_loopback("localhost") and not oci.is_loopback("10.0.0.1:5000")
    assert referrers.fallback_tag("sha256:" + "a" * 64) == "sha256-" + "a" * 64


@pytest.mark.parametrize("target, message", [
    ("cpu-torch2\n", r"reference: 'cpu-torch2\n' is not an image reference (host/repository[:tag][@sha256:digest])"),
    ("h:1/team/x:1.0\n", r"reference: 'h:1/team/x:1.0\n' tag is not a valid tag"),
    ("h:1/team/x@sha256:" + "0" * 64 + "\n", r"reference: 'h:1/team/x@sha256:" + "0" * 64 + r"\n' digest is not "
     "sha256:<64 hex>"),
    ("h:1/team/x\n", r"reference: 'h:1/team/x\n' is not an image reference (host/repository[:tag][@sha256:digest])"),
    ("h;id:1/team/x", "reference: 'h;id:1/team/x' registry is not HOST[:PORT] (a port in 1..65535)"),
    ("h:99999/team/x", "reference: 'h:99999/team/x' registry is not HOST[:PORT] (a port in 1..65535)"),
    ("h:1/" + "a" * 2000, "reference: 'h:1/" + "a" * 192 + "... is not a recipe name or image reference (at most "
     "456 characters)"),
])
def test_references_are_matched_whole(target, message):
    """A trailing newline (which ``$`` lets through) or a malformed registry host is a usage
    error (64); the well-formed twins are in test_references_parse."""
    with pytest.raises(EnvbuildError) as e:
        naming.parse_target(target, "h:1")
    assert (e.value.exit_code, str(e.value)) == (ExitCode.USAGE, message)
    assert str(naming.parse_target("[::1]:5000/team/x:1", None)) == "[::1]:5000/team/x:1"



@pytest.mark.parametrize("recipe", ["../../../root/.bashrc", "cpu-torch2\nverdict: PASSED", "cuda12-torch2",
                                    "cpu-torch2"])
def test_the_sif_file_is_named_by_the_repository_never_by_the_registrys_certificate(recipe):
    """The certificate comes from the registry: its recipe (a path, a newline, another recipe)
    never reaches the file apptainer writes; the twin, the true recipe, gives the same name."""
    from builder.publish.pull import sif_name

    cert = {"recipe": recipe, "lock_hash": "sha256:" + "c4ee94a7bde4" + "0" * 52}
    assert sif_name(naming.parse_target("cpu-torch2", "reg.example:5000"), cert) == "cpu-torch2_c4ee94a7bde4.sif"
    assert sif_name(naming.parse_target("reg.example:5000/team/torch@sha256:" + "0" * 64, None), cert) \
        == "torch_c4ee94a7bde4.sif"
