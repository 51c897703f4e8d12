"""Where the cluster's credentials are, and a ``kubernetes`` API client made from them.

The client gets a configuration of its own (the ``kubernetes`` package's global default
is left alone), so several clusters can be talked to in one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.core.errors import Unreachable
from builder.core.inputs import one_line

#: ``kubeconfig`` value meaning "use the pod's service account" (running inside a cluster).
IN_CLUSTER = "in-cluster"
#: Where a pod's service account token is mounted (in-cluster configuration).
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def find_kubeconfig(environ: Mapping[str, str] | None = None, home: str | None = None,
                    manifests: str | None = None) -> str:
    """Where the cluster's credentials are: the first existing file of ``$KUBECONFIG``
    (a ``:``-separated list), else ``~/.kube/config`` (only when ``$KUBECONFIG`` is unset,
    as kubectl does), else :data:`IN_CLUSTER` when running in a pod with a service account
    (``KUBERNETES_SERVICE_HOST`` and a token).

    Args:
        manifests: the folder of the rendered manifests, named in the error.

    Raises:
        Unreachable: (exit 3) none of these; one line.
    """
    environ = os.environ if environ is None else environ
    listed = [p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    for p in listed:
        if os.path.isfile(p):
            return p
    default = os.path.join(home or environ.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    if not listed and os.path.isfile(default):
        return default
    if environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(os.path.join(SA_DIR, "token")):
        return IN_CLUSTER
    where = f"KUBECONFIG={environ.get('KUBECONFIG')!r} names no file" if listed else f"no {default}"
    raise Unreachable(f"no kubeconfig ({where}, not in a pod): cannot apply; the manifests are "
                      f"rendered: `kubectl apply -f {manifests or 'DIR'}` where a cluster answers")


def api_client(kubeconfig: str, context: str | None = None) -> tuple[Any, str | None]:
    """``(kubernetes.client.ApiClient, the context's namespace or None)`` for a kubeconfig
    file (its ``context``, default the current one) or :data:`IN_CLUSTER`.

    Raises:
        Unreachable: (exit 3) the ``kubernetes`` package is missing or the configuration
            cannot be loaded.
    """
    try:
        from kubernetes import client, config
    except ImportError:
        raise Unreachable("--apply needs the kubernetes package (a dependency of envbuild): "
                          "pip install kubernetes") from None
    try:
        configuration = client.Configuration()
        if kubeconfig == IN_CLUSTER:
            config.load_incluster_config(client_configuration=configuration)
            ns_file = os.path.join(SA_DIR, "namespace")
            namespace = Path(ns_file).read_text().strip() if os.path.isfile(ns_file) else None
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                    persist_config=False)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            if context:
                active = next((c for c in contexts if c.get("name") == context), active)
            namespace = ((active or {}).get("context") or {}).get("namespace")
    except Exception as e:  # noqa: BLE001 - config errors of many kinds
        raise Unreachable(f"kubeconfig {kubeconfig}: {one_line(e, 200)}") from None
    return client.ApiClient(configuration=configuration), namespace
