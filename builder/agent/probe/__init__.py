"""Describe the software and GPUs of this machine or image as one JSON document.

Runs inside images and on bare hosts, shipped by :mod:`builder.agent.payload`: the agent
folder bind-mounted read-only at ``/opt/envbuild`` (``import probe``), or the payload
archive on stdin (``docker exec``, ssh, ``srun``). Self-contained: the standard library
only; ``torch`` and ``pynvml`` are imported lazily and only if present; NVML and NCCL are
otherwise reached through ``ctypes``. Python >= 3.8. Two ways to run it::

    python3 -m probe [--host|--image]  # prints the JSON document to stdout, exit 0
    import probe; probe.collect()      # returns the same document as a dict

Modules: :mod:`.osinfo` (os-release, glibc), :mod:`.torchinfo` (Python, torch),
:mod:`.nccl` (loaded, on disk, pip), :mod:`.nvml` (GPUs, driver, compute processes),
:mod:`.network`, :mod:`.container` (runtime, image), :mod:`.libs` (NCCL network plugin,
CUDA runtimes loaded), :mod:`.collect` (the document).

It never raises for a missing or broken component: problems go into ``errors``.

Output schema ``envbuild.probe/1`` (every key always present)::

    {
      "schema": "envbuild.probe/1",
      "scope": "host"|"image"|null,         # --host (envbuild probe --host, ssh, srun, gate)
                                            # or --image (docker exec in a container); null
                                            # when the caller did not say
      "probed_at": "2025-06-01T12:00:00Z",  # UTC, when the probe ran
      "hostname": str,                      # socket.gethostname()
      "kernel": str,                        # platform.release(), e.g. "6.1.0-18-amd64"
      "os": {"id": str|null, "version_id": str|null, "pretty_name": str|null},
                                            # /etc/os-release (or /usr/lib/os-release)
      "glibc": str|null,                    # "2.36"; platform.libc_ver() or
                                            # os.confstr("CS_GNU_LIBC_VERSION")
      "python": {"version": "3.11.2", "executable": str},
      "torch": null                         # torch not importable
             | {"version": "2.13.0+cpu",
                "cuda": str|null,           # torch.version.cuda: CUDA torch was built with
                "cuda_available": bool,     # torch.cuda.is_available()
                "cudnn": "91002"|null,      # torch.backends.cudnn.version() as a string
                "nccl_compiled": "2.27.3"|null},
                                            # torch.cuda.nccl.version(): the NCCL header
                                            # torch was compiled against, NOT the library
                                            # loaded (pytorch#116977); only for CUDA builds
      "nccl": {
        "loaded": null | {"version": "2.27.3", "code": 22703, "path": str},
                                            # the libnccl mapped into THIS process (after
                                            # importing torch), asked via ncclGetVersion
        "found": [{"path": str, "realpath": str, "version": str|null, "code": int|null,
                   "error": str|null}, ...],
                                            # every libnccl.so* on disk in the searched
                                            # dirs (see nccl.nccl_search_dirs), deduplicated
                                            # by realpath (path: the real file when met
                                            # by name, else its first symlink), sorted by
                                            # path; each version
                                            # asked via ncclGetVersion in a subprocess
        "pip_packages": {"nvidia-nccl-cu12": "2.27.3", ...},
                                            # installed distributions named nvidia-nccl*
        "net_plugin": {"requested": str|null, "path": str|null, "realpath": str|null,
                       "sha256": "sha256:..."|null, "name": str|null, "api": "v8"|null,
                       "version": "1.14.0"|null}
                                            # the network plugin NCCL would load
                                            # (NCCL_NET_PLUGIN, libnccl-net.so; see
                                            # libs): path null when there is none
      },
      "cuda_runtime": {"loaded": [{"path": str, "version": "12.8"|null}, ...]},
                                            # libcudart* mapped after importing torch
      "gpus": [{"index": 0, "name": str, "uuid": str, "pci_bus_id": str,
                "memory_total_bytes": int,
                "pci_id": "10de:2330"|null}, ...],
                                            # NVML (pynvml if importable, else ctypes on
                                            # libnvidia-ml.so.1); [] without a driver;
                                            # pci_id: vendor:device (as `lspci -n`) from
                                            # nvmlPciInfo_t.pciDeviceId
      "driver": "570.124.06"|null,          # NVML, else /proc/driver/nvidia/version
      "env": {name: value},                 # NCCL_*, GLOO_*, TORCH_*, CUDA_VISIBLE_DEVICES,
                                            # NVIDIA_VISIBLE_DEVICES, LD_LIBRARY_PATH,
                                            # NVIDIA_REQUIRE_CUDA, NVIDIA_DISABLE_REQUIRE
      "container": {                        # the container this probe runs in, if any
        "runtime": "docker"|"podman"|"apptainer"|"kubernetes"|"lxc"|str|null,
                                            # /.dockerenv, /run/.containerenv, $container,
                                            # $APPTAINER_CONTAINER/$SINGULARITY_CONTAINER,
                                            # $KUBERNETES_SERVICE_HOST; null on a bare host
        "version": str|null,                # $ENVBUILD_RUNTIME_VERSION (set by whoever
                                            # starts the probe in a container)
        "installed": {"docker": "20.10.24+dfsg1", ...}
                                            # runtimes on PATH here (`NAME --version`):
                                            # docker, podman, apptainer, singularity, enroot
      },
      "image": {"ref": str|null, "digest": "sha256:..."|null, "id": "sha256:..."|null},
                                            # $ENVBUILD_IMAGE, $ENVBUILD_IMAGE_DIGEST (the
                                            # registry digest), $ENVBUILD_IMAGE_ID (the
                                            # engine's image ID); ref falls back to
                                            # $APPTAINER_CONTAINER / $SINGULARITY_CONTAINER
      "network": {
        "interfaces": [{"name": "eth0", "index": int|null, "up": bool|null,
                        "loopback": bool, "mtu": int|null,
                        "addresses": [{"family": "inet"|"inet6", "address": str,
                                       "prefixlen": int|null}, ...]}, ...],
                                            # names: socket.if_nameindex() (else
                                            # /proc/net/dev); flags and mtu:
                                            # /sys/class/net/NAME; IPv4: `ip -j addr` if
                                            # present, else ioctl SIOCGIFADDR/NETMASK;
                                            # IPv6: /proc/net/if_inet6; sorted by name
        "default_route_interface": str|null,  # /proc/net/route, destination 0.0.0.0
        "hostname_addresses": [str, ...],   # getaddrinfo(hostname): what gloo binds to
                                            # when GLOO_SOCKET_IFNAME is unset
        "ip_local_port_range": [int, int]|null
                                            # /proc/sys/net/ipv4/ip_local_port_range: the
                                            # ephemeral ports NCCL/gloo listen on
      },
      "shm": {"path": "/dev/shm", "size_bytes": int|null, "free_bytes": int|null},
                                            # os.statvfs("/dev/shm"); null when absent
      "gpu_processes": [{"gpu_index": int, "gpu_uuid": str, "pid": int,
                         "used_memory_bytes": int|null, "name": str|null}, ...],
                                            # NVML compute processes (PIDs as NVML sees
                                            # them: the host's PID namespace); name from
                                            # /proc/PID/comm when visible here
      "errors": [str, ...]                  # non-fatal problems met while probing
    }

The keys ``container``, ``image``, ``network``, ``shm``, ``gpu_processes``, the GPU
``pci_id`` and (issue 11) ``scope``, ``probed_at``, ``nccl.net_plugin`` and ``cuda_runtime``
were added to schema 1 without changing any earlier field: reports written before them
stay valid (``builder/nodes/report.py`` treats them as unknown when absent).

NCCL version codes follow ``NCCL_VERSION(X,Y,Z)`` in ``nccl.h``: ``X*1000 + Y*100 + Z``
up to 2.8, ``X*10000 + Y*100 + Z`` from 2.9 (see :func:`.nccl.nccl_version_from_code`).
"""

from __future__ import annotations

from .collect import SCHEMA, collect, main

__all__ = ["SCHEMA", "collect", "main"]
