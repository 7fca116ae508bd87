#!/bin/sh
# The Debian packages the two-node cluster tests need (tests/cluster.py, make test-cluster): Slurm's controller,
# node daemon and clients, munge, MPICH (mpiexec), and the namespace tools. Installed with apt-get where they are
# missing and this runs as root; elsewhere it says so and leaves the tests to skip, each with its reason.
# (Where systemd runs, installing them may start Debian's own munge service: the tests run a munged of their own,
# on a socket in their scratch folder, and touch no service of the machine's.)
set -u
PACKAGES="slurmctld slurmd slurm-client munge mpich iproute2 util-linux"
missing=""
for bin in munged mungekey slurmctld slurmd sbatch srun mpiexec ip nsenter unshare; do
  command -v "$bin" >/dev/null 2>&1 || missing="$missing $bin"
done
if [ -z "$missing" ]; then
  echo "cluster packages: installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "cluster packages: missing$missing; not root or no apt-get here: the cluster tests will skip"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null; then
  echo "cluster packages: installed ($PACKAGES)"
else
  echo "cluster packages: apt-get install $PACKAGES failed (registry unreachable?): the cluster tests will skip"
fi
exit 0
