"""Certificates for the report tests (builder/certify/report.py): today's shape (a kept ``/1``
JSON file written by builder.certify.certificate.build_certificate from two hand-written rank
results, tests/fixtures/certificate-allreduce-ddp.json, as ``envbuild report`` reads it: upgraded
by load_certificate, its sweep as ``collectives.all_reduce``), issue 10's sections added to it as w-i10a's
certificates hold them, hostile strings, and the checks of a page's markup (what a string
could have planted, what would load from elsewhere)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from builder.core.certificate import load_certificate

from fixtures_browser import Dom

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
#: Markup that must stay text wherever a certificate string lands.
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">{{ 7*7 }}$x^2$'


def todays_certificate() -> dict:
    """A passing ``envbuild.certificate/2`` of 2 gloo ranks, all-reduce at 8, 1024, 65536 B: the
    kept ``/1`` upgraded (written as ``/2``, so that it reads back as it is)."""
    doc = load_certificate(json.loads((FIXTURES / "certificate-allreduce-ddp.json").read_text())).to_dict()
    return {**doc, "schema": "envbuild.certificate/2"}


def profiles_certificate() -> dict:
    """A certificate of a real run: w-i10a's certify of cpu-torch2 with every profile on 2 gloo nodes."""
    return json.loads((FIXTURES / "certificate-profiles.json").read_text())


#: The log tail of a node whose rank raised (the lines torchrun prints), as a certificate keeps it.
NODE1_TAIL = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "/opt/envbuild/bench/node.py", line 88',
              "[rank1]:     check.run(group)", "[rank1]: RuntimeError: fsdp: shard 3 of 4 lost its gradient",
              "E1201 12:40:20 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
#: The failures of :func:`failing_certificate`, in the verdict's order and words.
FAILURES = ["rank 1 wrote no result: node 1 exited with 1",
            "collective all_reduce wrong at 8 B float32 (1 wrong element on rank 1), 1024 B float32 (1 wrong "
            "element on rank 1)",
            "training tp does not match its single-process reference: losses differ, parameters differ (max "
            "difference 0.0213; rtol 1e-05, atol 1e-06)",
            "all-reduce busbw 0.735 GB/s at 1048576 B is below the floor of 5 GB/s (argument); slowest rank 1 "
            "(1426.7 us)",
            "scaling efficiency 0.283 is below the floor of 0.5 (argument): 12.10 images/s at 2 ranks, 21.37 at 1"]


def failing_certificate() -> dict:
    """The real ``--profile all`` certificate (:func:`profiles_certificate`) as a failing run
    writes it: rank 1 lost (node 1 exited with 1, its log tail kept), all-reduce wrong on rank 1,
    tp off its reference, a busbw floor of 5 GB/s and a scaling floor of 0.5 missed, and 12
    warnings (:data:`FAILURES` in the verdict)."""
    doc = load_certificate(profiles_certificate()).to_dict()
    doc["verdict"] = {"passed": False, "exit_code": 2, "failures": list(FAILURES),
                      "warnings": [f"rank 1: cleanup: container {i} still stopping" for i in range(12)]}
    doc["ranks"]["1"] = {"node": 1, "reported": False, "exit_code": 1}
    doc["node_status"] = {"0": {"name": "node-0", "exit_code": 0, "log_tail": ["done"]},
                          "1": {"name": "node-1", "exit_code": 1, "log_tail": NODE1_TAIL}}
    doc["settings"].update(min_busbw_gbps=5.0, busbw_size=1 << 20, busbw_source="argument",
                           min_scaling_efficiency=0.5)
    for r in doc["collectives"]["all_reduce"][:2]:
        r.update(wrong=1, wrong_ranks=[1], wrong_rank_count=1)
    doc["training"]["tp"].update(reference_match=False, losses_match=False, params_match=False,
                                 max_param_diff=0.0213, losses=[1.2, 1.1, 0.95])
    return doc


def row(size, dtype="float32", factor=1.0, wrong=0):
    alg = size / 1e9 / (1e-5 + size / 2e9)
    return {"size_bytes": size, "count": size // 4, "type": dtype, "redop": "sum", "time_us": 10.0 + size / 2e3,
            "min_time_us": 10.0, "median_time_us": 10.0, "slowest_rank": 0,
            "algbw_gbps": alg, "busbw_gbps": alg * factor, "wrong": wrong,
            "wrong_ranks": [0] if wrong else [], "wrong_rank_count": 1 if wrong else 0}


def issue10_doc(cert=None):
    """Today's certificate plus the sections of issue 10 (item 3), as w-i10a writes them."""
    doc = copy.deepcopy(cert or todays_certificate())
    sizes = [1024, 65536, 1 << 20, 4 << 20]
    doc["collectives"] = {
        "all_reduce": [row(s) for s in sizes] + [row(s, "bfloat16") for s in sizes],
        "all_gather": [row(s, factor=0.5) for s in sizes], "reduce_scatter": [row(s, factor=0.5) for s in sizes],
        "broadcast": [row(s) for s in sizes], "all_to_all": [row(s, factor=0.5) for s in sizes],
        "send_recv": {"unsupported": "gloo has no batched isend/irecv ring in this torch"},
    }

    def check(**kw):
        base = {"unsupported": None, "needs_numpy": False, "reference_match": True, "losses_match": True,
                "params_match": True, "tolerance": {"rtol": 1e-5, "atol": 1e-6, "rule": "float32 sums"},
                "losses": [2.30, 2.10, 1.95, 1.80], "reference_losses": [2.30, 2.10, 1.95, 1.80],
                "max_param_diff": 1e-7, "samples_per_s": 120.0, "wall_s": 1.5, "steps": 4, "model": "mlp"}
        return {**base, **kw}

    doc["training"] = {"ddp": check(model="resnet18"), "fsdp": check(),
                       "pipeline": check(schedule="ScheduleGPipe", stages=2),
                       "tp": check(reference_match=False, losses=[2.30, 2.20, 2.15, 2.12]),
                       "moe": {"unsupported": "needs numpy", "needs_numpy": True}}
    doc["scaling"] = {"model": "resnet18", "batch_per_rank": 8, "image_size": 64, "steps": 3, "world_size": 2,
                      "throughput_1": 50.0, "throughput_n": 93.0, "time_1_s": 1.0, "time_n_s": 1.1,
                      "efficiency": 0.93}
    doc["stack"] = {"source": "probe", "recipe": None, "reference_rank": 0, "python": "3.11.2",
                    "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "glibc": "2.36",
                    "os": "Debian GNU/Linux 12 (bookworm)"}
    return doc


def hostile_certificate() -> dict:
    doc = todays_certificate()
    doc["image"]["ref"] = HOSTILE
    doc["run_id"] = "</title><script>alert(1)</script>"
    doc["ranks"]["0"]["hostname"] = HOSTILE
    doc["ranks"]["1"]["errors"] = [HOSTILE]
    doc["verdict"]["warnings"] = [HOSTILE + "\x1b[31m\u202e"]
    doc["probe"]["0"]["os"]["pretty_name"] = HOSTILE
    doc["collectives"]["all_reduce"][0]["type"] = HOSTILE[:200]
    doc["ranks"]["0"]["lock_mismatches"] = [HOSTILE]
    return doc


def injected(dom: Dom) -> list[str]:
    """What in a page is markup a certificate string could have planted: script, img,
    iframe, object or embed elements, event-handler attributes, javascript: URLs."""
    found = [t for t, _ in dom.tags if t in ("script", "img", "iframe", "object", "embed")]
    for tag, attrs in dom.tags:
        found += [f"{tag}[{k}]" for k, v in attrs.items()
                  if k.startswith("on") or "javascript:" in (v or "").lower()]
    return found


def external(dom: Dom, raw: str) -> list[str]:
    """What a page would load from elsewhere: src/href/srcset/action/data attributes that are
    not in-page fragments (``#id``), and CSS ``@import``/``url(...)``."""
    loads = ("src", "href", "xlink:href", "srcset", "action", "data", "poster")
    found = [f"{tag}[{k}={v}]" for tag, attrs in dom.tags for k, v in attrs.items()
             if k in loads and not (v or "").startswith("#")]
    return found + re.findall(r"@import|url\((?!#)[^)]*\)", raw)
