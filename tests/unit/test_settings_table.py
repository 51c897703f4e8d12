"""One default table of certification settings, one resolved model the certificate stores,
and certificates of schema ``/1`` still read by report, gate / verify --against and push."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import yaml

from builder.certify import report
from builder.certify.settings import Overrides, resolve
from builder.core.certificate import load_certificate
from builder.nodes.reference import read_certificate
from builder.publish import store
from builder.recipe.load import parse
from builder.recipe.lock import validate_lock
from builder.recipe.model import DEFAULT_CERTIFY, lock_certify

from factories import lock_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def test_a_lockless_image_and_a_recipe_without_certify_resolve_to_the_same_settings(tmp_path):
    text = (ROOT / "recipes" / "cpu-torch2.yaml").read_text()
    recipe_file = tmp_path / "plain.yaml"
    recipe_file.write_text(text.split("\ncertify:")[0] + "\n")
    loaded = parse(recipe_file)
    assert not loaded.errors
    lock = lock_of(msgspec.to_builtins(lock_certify(loaded.recipe.certify)), recipe="plain")
    from_recipe = resolve(lock, Overrides(), gpu_visible=False)
    lockless = resolve(None, Overrides(), gpu_visible=False)
    assert (from_recipe.recipe, lockless.recipe) == ("plain", "unknown")
    assert {**from_recipe.to_dict(), "recipe": "unknown"} == lockless.to_dict()
    assert (lockless.iters, lockless.warmup, lockless.shm_size, lockless.timeout_s) == (10, 2, "256m", 300.0)
    assert (lockless.ddp_steps, lockless.ddp_batch, lockless.ddp_image_size, lockless.profiles) == (3, 4, 32, ["ddp"])


def test_the_lock_ddp_section_sets_the_ddp_profile_check():
    s = resolve(lock_of({"ddp": {"steps": 2, "batch_size": 6, "image_size": 48}}), gpu_visible=False)
    args = s.bench_args()
    assert [args[args.index(k) + 1] for k in ("--ddp-steps", "--ddp-batch", "--ddp-image-size", "--profiles")] \
        == ["2", "6", "48", "ddp"]
    doc = lock_of().to_dict()
    doc["certify"]["ddp"]["batch_size"] = 1
    try:  # the fault twin: out of the recipe's bounds, refused as the lock is read
        validate_lock(doc, "lock")
    except Exception as e:  # ManyErrors, exit 2, naming the field
        assert "certify.ddp.batch_size" in str(e) and getattr(e, "exit_code", None) == 2
    else:
        raise AssertionError("a batch of 1 was accepted")


def _v1(name):
    doc = json.loads((FIXTURES / name).read_text())
    assert doc["schema"] == "envbuild.certificate/1" and "allreduce" in doc and "ddp" in doc
    return doc


def test_a_v1_certificate_reads_as_the_one_model_with_its_sweep_as_all_reduce():
    doc = _v1("certificate-allreduce-ddp.json")
    cert = load_certificate(doc, "certificate-allreduce-ddp.json")
    assert cert.schema == "envbuild.certificate/2"  # upgraded: the document says what it now is
    assert (cert.settings.sizes, cert.settings.iters, cert.settings.ddp_batch) == ([8, 1024, 65536], 10, 8)
    rows = cert.collectives["all_reduce"]
    assert isinstance(rows, list) and [r.size_bytes for r in rows] == [8, 1024, 65536]
    assert cert.settings.min_busbw_gbps is None and cert.settings.busbw_size == 65536
    profiles = load_certificate(_v1("certificate-profiles.json"))
    assert profiles.settings.profiles == ["ddp", "fsdp", "tp", "pipeline", "moe"]
    assert "allreduce" not in profiles.to_dict() and "ddp" not in profiles.to_dict()


def test_report_gate_and_push_read_a_v1_certificate(tmp_path):
    doc = _v1("certificate-allreduce-ddp.json")
    html = report.render_html(load_certificate(doc).to_dict(), source="v1.json")
    assert "all_reduce" in html and "PASSED" in html.upper()
    run = read_certificate(FIXTURES / "certificate-allreduce-ddp.json")  # gate, verify --against
    assert run.passed and run.recipe == "cpu-torch2" and run.probes
    folder = tmp_path / "cpu-torch2" / "certificates"
    folder.mkdir(parents=True)
    (folder / "old.json").write_text(json.dumps(doc))
    (folder / "other.json").write_text(json.dumps({**doc, "schema": "envbuild.certificate/9"}))
    assert [p.name for p, _ in store.certificates(tmp_path, "cpu-torch2")] == ["old.json"]


def _spelled_defaults(certify: dict, cuda: bool) -> list[str]:
    """The ``certify`` keys (dotted) a recipe gives the value the default table would give it
    anyway (a CUDA recipe's derived nccl and 1 GPU count as defaults too)."""
    table = msgspec.to_builtins(DEFAULT_CERTIFY)
    table.update({"backend": "nccl", "gpus_per_node": 1} if cuda else {})

    def walk(given: dict, default: dict, at: str) -> list[str]:
        out = []
        for key, value in given.items():
            if isinstance(value, dict) and isinstance(default.get(key), dict):
                out += walk(value, default[key], f"{at}{key}.")
            elif key in default and value == default[key]:
                out.append(at + key)
        return out

    return walk(certify, table, "certify.")


@pytest.mark.parametrize("name", ["cpu-torch2", "cuda12-torch2"])
def test_the_shipped_recipes_spell_only_what_differs_from_the_default_table(name):
    doc = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
    assert _spelled_defaults(doc.get("certify") or {}, doc["cuda"] is not None) == []
    # the fault twin: spelling a default is seen, nested or not
    spelled = {**(doc.get("certify") or {}), "timeout_s": 300, "ddp": {"steps": 3, "batch_size": 64},
               "backend": "nccl" if doc["cuda"] else "gloo"}
    assert _spelled_defaults(spelled, doc["cuda"] is not None) == ["certify.timeout_s", "certify.ddp.steps",
                                                                   "certify.backend"]
