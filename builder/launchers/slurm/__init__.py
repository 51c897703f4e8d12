"""Slurm launcher: one batch job, one task per envbuild node running torchrun in a docker, pyxis
or apptainer container; the script stays in the run folder to be rerun by hand. Sources:
https://slurm.schedmd.com/sbatch.html, https://github.com/NVIDIA/pyxis/wiki/Usage.
"""

from .launcher import SlurmLauncher
from .options import (
    DEFAULT_PENDING_TIMEOUT_S,
    DEFAULT_RUNTIME,
    SlurmOptions,
    check_container_image,
    check_partition,
    check_sbatch_arg,
    check_slurm_dir,
    check_slurm_nodes,
    parse_time_limit,
)
from .script import default_slurm_dir

__all__ = ["DEFAULT_PENDING_TIMEOUT_S", "DEFAULT_RUNTIME", "SlurmLauncher", "SlurmOptions", "check_container_image",
           "check_partition", "check_sbatch_arg", "check_slurm_dir", "check_slurm_nodes", "default_slurm_dir",
           "parse_time_limit"]
