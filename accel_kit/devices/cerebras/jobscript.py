"""The job script of a Cerebras Wafer-Scale Cluster (``accel-kit jobscript STUDY --system cs2``).

A cluster run as an appliance has no batch scheduler: the script runs on its user node, and each
point is one client process whose compile and train jobs the cluster's management server queues.
So the script is the adapter's own, handed to ``accel_kit.engine.launch.render_jobscript`` through
``JobLaunch.template`` and formatted with the same fields as the PBS and Slurm scripts.
"""
from __future__ import annotations


APPLIANCE_TEMPLATE = """#!/bin/bash
# accel-kit {study} on up to {nodes} CS-2 system(s) of {system}, a Cerebras Wafer-Scale Cluster run as an
# appliance (cerebras-pytorch 2.x): no batch scheduler. Run this script on the cluster's user node, e.g.
#   nohup bash {path} > {path}.log 2>&1 &
# Each point is one client process there; the cluster's management server queues its compile and train
# jobs and lends it the point's number of CS-2 systems (num_csx). Written for the documented cstorch launch,
# not run by accel-kit's authors (no cluster was at hand).
set -euo pipefail
workdir={workdir}
cd "$workdir"
# The Cerebras environment of the checkout (make cerebras); its cerebras-pytorch must be the cluster's release.
source {root}/.venv-cerebras/bin/activate
# The cluster settings (accel_kit/devices/cerebras/options.py, CerebrasOptions; these override
# params/systems/{system}.yaml).
export ACCEL_KIT_CEREBRAS_NUM_CSX={nodes}  # the most CS-2 systems a point may use
export ACCEL_KIT_CEREBRAS_JOB_TIME_SEC={walltime_s}  # each appliance job's limit, queue time excluded
# The input workers import accel_kit and read the prepared data: this checkout and the data's folder are
# mounted by default; list others here (colon-separated).
# export ACCEL_KIT_CEREBRAS_MOUNT_DIRS={root}:/path/to/data
# export ACCEL_KIT_CEREBRAS_PYTHON_PATHS={root}
# export ACCEL_KIT_CEREBRAS_MGMT_ADDRESS=<host:port>  # default: the user node's /opt/cerebras/config_v2
# export ACCEL_KIT_CEREBRAS_COMPILE_ONLY=true  # compile every point, run none
accel-kit run {study} --system {system} --profile {profile} -p launcher local -p max_nodes 1{extra}
"""
