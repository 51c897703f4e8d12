"""builder/resolve/, the resolved pins in rendering, and reproducible builds (builder/image/fshash.py).

Golden files: ``tests/golden/golden-locked/`` is rendered from ``tests/recipes/golden-locked.yaml``
with the hand-written ``envbuild.resolved.json`` next to it (``make golden``).

The reproducibility test runs the whole route once: ``envbuild lock`` (pip's resolver,
apt in the base image) for a copy of the cpu-torch2 recipe, rendering with
``--require-hashes``, then two builds through ``builder.image.build.build`` with BuildKit's
cache disabled, and compares the filesystem content hashes. Its site wheel folder holds a
stand-in ``torch-2.13.0+cpu`` wheel (a few lines of Python, made here) instead of the
real 200 MB wheel so that the two builds take seconds, not minutes: the pip, apt and
BuildKit steps are the real ones.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

from test_lock_units import ROOT, spec_of  # noqa: F401

from builder.image import build, engine, fshash
from builder.image.site import SiteOptions
from builder.oci.client import RegistryClient
from builder.render import rendered as render
from builder.render import write as render_write
from builder.resolve import lock

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


# --------------------------------------------------------------------------- lock + reproducibility


def stand_in_torch_wheel(folder: Path) -> Path:
    """A deterministic ``torch-2.13.0+cpu-py3-none-any.whl``: ``torch.__version__`` and
    ``torch.version.cuda`` only (what the probe reads), with valid dist-info."""
    files = {
        "torch/__init__.py": b'__version__ = "2.13.0+cpu"\nfrom . import version\n',
        "torch/version.py": b'__version__ = "2.13.0+cpu"\ncuda = None\n',
        "torch-2.13.0+cpu.dist-info/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        "torch-2.13.0+cpu.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: envbuild-test\nRoot-Is-Purelib: true\n"
                                           b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("torch-2.13.0+cpu.dist-info/RECORD,,")
    files["torch-2.13.0+cpu.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def test_lock_then_two_uncached_builds_install_the_same_files(docker_client, bootstrap_image, test_labels, tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "repro-torch.yaml").write_text((ROOT / "recipes/cpu-torch2.yaml").read_text())
    images = tmp_path / "images"
    spec = spec_of(recipes / "repro-torch.yaml")
    render_write.write(render.render(spec), images)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = stand_in_torch_wheel(wheels)
    site = SiteOptions(ca_bundle=CA_BUNDLE if CA_BUNDLE.is_file() else None, wheel_dir=wheels)

    result = lock.lock(spec, images, site, docker_client, base_mode="bootstrap", labels=test_labels,
                       registry=RegistryClient)
    doc = result.resolved.to_dict()
    assert doc["pip"] == [{"name": "numpy", "version": "2.3.5",  # the recipe's pin, from PyPI
                           "hashes": ["sha256:8cba086a43d54ca804ce711b2a940b16e452807acebe7852ff327f1ecd49b0d4"],
                           "file": "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
                           "requested": True},
                          {"name": "torch", "version": "2.13.0+cpu",
                           "hashes": ["sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()],
                           "file": wheel.name, "requested": True}]
    assert set(doc["apt"]) == {"python3", "python3-venv"} and all(doc["apt"].values())
    assert doc["base"]["digest"] is None and any(n.startswith("base debian:bookworm-slim") for n in result.unresolved)
    assert (images / "repro-torch/envbuild.resolved.json").read_bytes() == \
        (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    dockerfile = (images / "repro-torch/Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and f"python3={doc['apt']['python3']}" in dockerfile
    assert "resolved" in json.loads((images / "repro-torch/envbuild.lock.json").read_text())

    cli = engine.buildkit_cli()
    no_cache = dataclasses.replace(cli, argv=(*cli.argv, "--no-cache"))
    ids, hashes = [], []
    try:
        for _ in range(2):
            res = build.build(build.BuildOptions(recipe="repro-torch", images_dir=images, site=site, base_mode="bootstrap",
                                                 labels=test_labels, rebuild=True), docker_client, cli=no_cache)
            ids.append(res.image_id)
            hashes.append(fshash.image_fshash(docker_client, res.image_id, labels=test_labels))
        assert ids[0] != ids[1]  # timestamps differ: image IDs do
        assert hashes[0].sha256 == hashes[1].sha256, fshash.differences(hashes[0], hashes[1])
        assert hashes[0].entries > 1000
        # without the exclusions, the two builds differ (what the exclusions are for)
        raw = [fshash.image_fshash(docker_client, i, labels=test_labels, patterns=()) for i in ids]
        assert raw[0].sha256 != raw[1].sha256
    finally:
        for image_id in ids:
            try:
                docker_client.sdk.images.remove(image_id, force=True)
            except Exception:  # noqa: BLE001 - removed by label at session end otherwise
                pass
