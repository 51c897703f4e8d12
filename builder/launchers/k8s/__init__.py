"""Kubernetes launcher: render the manifests (Indexed Job + headless Service, or a Kubeflow
TrainJob) that run a certification on a cluster; apply them and collect the results.

May import: builder.core, builder.recipe, builder.image, builder.agent (payload only),
builder.launchers.base/local; the ``kubernetes`` package only in api and kubeconfig, lazily.

By default the ranks run as an **Indexed Job** with a **headless Service**, built-in kinds
that need no operator (Kubernetes docs: "Job" -> "Completion mode" and "Job with Pod-to-Pod
Communication"; "Service" -> "Headless Services"). For a LaunchSpec of N nodes with G GPUs
each (P = max(G, 1) processes per node), :func:`.manifests.render_manifests` writes:

``configmap.yaml``
    envbuild's in-image code (:mod:`.code`) as an immutable ConfigMap
    ``envbuild-<run>-code``, mounted read-only at ``/opt/envbuild`` (``PYTHONPATH``), so
    certifying never changes the image.
``service.yaml``
    Service ``envbuild-<run>`` with ``clusterIP: None`` selecting the Job's pods
    (``batch.kubernetes.io/job-name``), ``publishNotReadyAddresses: true``, and the
    rendezvous port declared. With the pods' ``subdomain`` set to it, pod i of an Indexed
    Job resolves as ``<job>-<i>.<service>``; node 0 is the master address.
``job.yaml``
    Job ``envbuild-<run>``: ``completionMode: Indexed``, ``completions`` = ``parallelism``
    = N, ``backoffLimit: 0`` (a failed node fails the run, the Job controller then stops the
    others), ``activeDeadlineSeconds`` = the timeout (counted from the Job's start, so it
    includes scheduling and image pulls), ``ttlSecondsAfterFinished``. Each pod runs the
    image **by digest** as::

        python3 -m torch.distributed.run --nnodes N --nproc-per-node P \\
            --node-rank $(JOB_COMPLETION_INDEX) --master-addr <job>-0.<service> \\
            --master-port PORT --max-restarts 0 -m bench --out /results <bench args>

    (the Job controller sets ``JOB_COMPLETION_INDEX`` in every container; Kubernetes expands
    ``$(VAR)`` in ``args``), wrapped by a POSIX ``sh`` script (:data:`.pod.NODE_SCRIPT`)
    that then prints each ``/results/rank-<r>.json`` between marker lines and exits with
    torchrun's status, so the results come back with the pod logs. Per pod (:mod:`.pod`):
    ``nvidia.com/gpu: G`` as request and limit, an ``emptyDir`` with ``medium: Memory`` at
    ``/dev/shm`` whose ``sizeLimit`` is the recipe's ``shm_size`` (Docker ``8g`` ->
    Kubernetes ``8Gi``), ``emptyDir`` volumes at ``/tmp``, ``/tmp/home`` (``HOME``) and
    ``/results``, the "restricted" Pod Security Standard (``runAsNonRoot`` with the
    arbitrary UID/GID 12345, no privilege escalation, all capabilities dropped,
    ``RuntimeDefault`` seccomp) and ``readOnlyRootFilesystem``; a pod anti-affinity on
    ``kubernetes.io/hostname`` (preferred by default, ``required`` puts every node on its
    own host); labels ``app.kubernetes.io/managed-by: envbuild``, ``envbuild: "1"``,
    ``envbuild.run: <run>`` (plus ``spec.labels`` and ``$ENVBUILD_EXTRA_LABELS``).

With ``kubeflow=True`` it renders ``configmap.yaml`` and ``trainjob.yaml`` instead: a
Kubeflow Trainer v2 ``TrainJob`` (API ``trainer.kubeflow.org/v1alpha1``, field names of
Trainer v2.1: ``podTemplateOverrides``; Trainer v2.0 called it ``podSpecOverrides`` and
later releases replace it with ``runtimePatches``). Trainer v2 ``TrainJob`` replaces the
Training Operator v1 ``PyTorchJob`` (``kubeflow.org/v1``), which is not rendered. The
TrainJob references the ``ClusterTrainingRuntime`` ``torch-distributed`` by default; that
runtime's Torch plugin sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` (``<name>-node-0-0.<name>``) and ``PET_MASTER_PORT`` (29400, not the
recipe's port), which torchrun reads as its defaults; its security context and deadline
come from the runtime (Trainer v2.1 cannot override them per TrainJob). Sources: Kubeflow
Trainer docs ("Migrating to Kubeflow Trainer v2", "PodTemplate Overrides") and the
v1alpha1 Go types (``pkg/apis/trainer/v1alpha1/trainjob_types.go``).

The objects are plain dicts (:mod:`.objects`) written by ``yaml.safe_dump``
(:mod:`.manifests`). :class:`.launcher.K8sLauncher` (``--apply``) creates them through the
``kubernetes`` client's dynamic client (:mod:`.api`) when a kubeconfig is present
(:func:`.kubeconfig.find_kubeconfig`), watches the Job and its pods a bounded time,
collects each rank's result from the pod logs (:mod:`.results`), deletes what it created
(also on failure and Ctrl-C) and returns a LaunchResult.

Command line (``builder/cli/app.py``): ``envbuild k8s render IMAGE|RECIPE --out DIR [--apply]``.
"""
