"""The one adapter between the audit and recipe's rules: the file's pins as a recipe, checked by the very code
``envbuild check`` runs, each finding mapped back to the file's line. The only audit module that knows the recipe's
schema and rule ids. Findings that do not apply to a file are dropped, each for a reason (:func:`_applies`); a
schema error on a file's value becomes a note."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from packaging.version import Version

from builder.recipe import load
from builder.recipe import rules as recipe_rules
from builder.recipe.facts import facts
from builder.recipe.rules.network import SOCKET_VARIABLES
from builder.recipe.spec import Finding as RuleFinding
from builder.recipe.spec import Spec

from .extract import Item
from .model import Finding, Level
from .pins import Pins, variant_cuda
from .rules import Out


def recipe_data(p: Pins, driver: str | None) -> tuple[dict[str, Any], dict[str, Item], frozenset[str]]:
    """``(recipe mapping, origin of each field, fields the file leaves unknown)`` of ``p``. ``torch.variant`` stays
    unknown when nothing names it: the rules must not derive one."""
    data: dict[str, Any] = {}
    at: dict[str, Item] = {}
    unknown = frozenset({"torch.variant"}) if p.torch and not p.torch.variant else frozenset()
    st, t = p.stack, p.torch
    if st.base.image and st.base.repo:  # a valid image reference
        data["base"] = {"image": st.base.image}
        at["base.image"] = st.base_item
    if p.os:
        data["os"] = {"id": p.os[0], "version": p.os[1]}
        at["os.id"] = at["os.version"] = st.base_item
    if p.python:  # the base image's or system Python: its origin is the base image
        data["python"] = p.python.value
        at["python"] = st.base_item if p.python_from in ("system", "base") else p.python
    vcuda = variant_cuda(t.variant) if t else None
    if st.base.cuda:
        data["cuda"] = {"version": ".".join(st.base.cuda.split(".")[:2])}
        at["cuda.version"] = at["cuda"] = st.base_item
    elif t and vcuda:
        data["cuda"] = {"version": vcuda}
        at["cuda.version"] = at["cuda"] = t.item
    elif t and t.variant == "cpu":
        data["cuda"] = None
    if driver and data.get("cuda"):
        data["cuda"]["driver"] = driver
        at["cuda.driver"] = Item(t.item.value, t.item.line, f"--driver {driver}") if t else Item(driver, 1, "--driver")
    if t:
        torch = {k: v for k, v in (("version", t.release), ("variant", t.variant)) if v}
        if torch:
            data["torch"] = torch
        at["torch"] = at["torch.version"] = at["torch.variant"] = t.item
        if t.index is not None:
            data["index"] = {"torch_url": t.index.url.value}
            at["index.torch_url"] = t.index.url
        elif t.local and t.installer in ("pip", "uv"):  # a +cuXYZ pin with no PyTorch index: pip reads PyPI
            data["index"] = {"torch_url": "https://pypi.org/simple"}
            at["index.torch_url"] = t.item
        data["certify"] = {"backend": "gloo" if t.variant == "cpu" or not data.get("cuda") else "nccl"}
    for key, pin in (("nccl", p.nccl), ("cudnn", p.cudnn)):
        if pin:
            data[key], at[key] = pin[1], pin[0]
    apt_items: dict[str, Item] = {}
    for a in st.apt:
        apt_items.setdefault(f"{a.name}={a.version}" if a.version else a.name, a.item)
    apt = list(apt_items)
    pip = [str(req) for _item, req, _tool in p.pip]
    data["packages"] = {"apt": apt, "pip": pip}
    for i, item in enumerate(apt_items.values()):
        at[f"packages.apt[{i}]"] = item
    for i, (item, _req, _tool) in enumerate(p.pip):
        at[f"packages.pip[{i}]"] = item
    # the environment variables the recipe rules read (socket-ifname-loopback)
    env = {e.name: e.value for e in st.env if e.name in SOCKET_VARIABLES and e.value is not None}
    if env:
        data["env"] = env
        for e in st.env:
            if e.name in env:
                at[f"env.{e.name}"] = Item(f"{e.name}={e.value}", e.line)
    return data, at, unknown


def check_data(data: dict[str, Any], file: str, unknown: frozenset[str] = frozenset()) -> Spec:
    """``data`` (a recipe as loaded YAML) through the recipe schema and rules, without a file."""
    loaded = load.validate(data, file, "audit")
    if unknown:
        loaded = dataclasses.replace(loaded, invalid=loaded.invalid | unknown)
    return recipe_rules.check(loaded)


def _applies(f: RuleFinding, p: Pins) -> bool:
    if f.rule in ("torch-index", "cuda-minor", "torch-floor"):  # a file's torch may be older than a recipe's
        return False
    if f.rule == "os-python" and p.python_from != "system":
        return False
    if f.rule == "second-stack" and f.fields == ("base.image",) and p.torch and p.torch.installer == "base":
        return False
    return True


def _origin(fields: tuple[str, ...] | list[str], at: dict[str, Item]) -> Item | None:
    for name in fields:
        for key in (name, name.split("[", 1)[0], name.split(".", 1)[0]):
            if key in at:
                return at[key]
    return None


def judge(p: Pins, driver: str | None = None) -> tuple[list[Finding], Spec]:
    """Recipe's schema and rules on ``p``: findings at the file's lines, and the resolved Spec."""
    data, at, unknown = recipe_data(p, driver)
    file = p.stack.file
    spec = check_data(data, file, unknown)
    out = Out(file)
    for e in spec.schema_errors:
        origin = _origin([e.field or ""], at)
        if origin is None or e.message == "is required":  # a field the file does not give (an unpinned torch)
            continue
        out.add("note", "not-judged", origin, f"as the recipe field {e.field} it {e.message}; not judged by "
                "envbuild's rules", "recipe schema", (e.field or "",))
    for f in spec.findings:
        if f.rule == "torch-release":  # outside the facts: the release's rules skipped, never an error
            known = sorted(facts().torch, key=Version)
            blind = not (p.torch and p.torch.variant) and not p.stack.base.cuda and not p.os
            out.add("error" if blind else "warning", "nothing-judged" if blind else "torch-unknown",
                    _origin(f.fields, at), f"cannot judge torch {data['torch']['version']}: envbuild's compatibility "
                    f"data holds {known[0]} to {known[-1]}; "
                    + ("neither its build nor the base image's CUDA and OS are known: nothing could be judged" if blind
                       else "the rules on its release are skipped"), f.source, f.fields)
        elif _applies(f, p):
            out.add(cast(Level, f.level), f.rule, _origin(f.fields, at), f.message, f.source, f.fields)
    return out.items, spec

