#!/usr/bin/env bash
# Runs one rank of a test's `mpirun ... bash tests/engine/gpu_rank_env.sh STRATA ARGS...` with the
# NCCL environment that lets ranks share one GPU (docs/SCALEOUT.md "Expert parallel on GPU
# ranks"): NCCL refuses two ranks of one communicator on the same device ("Duplicate GPU
# detected"), a check that compares the ranks' host identifiers and bus ids. A distinct
# NCCL_HOSTID per rank makes every rank a host of its own to NCCL, which then connects them
# through its network transport: sockets (NCCL_IB_DISABLE=1) over the loopback interface
# (NCCL_SOCKET_IFNAME=lo), with NVLink multi-node and NVLS off (NCCL_MNNVL_ENABLE=0,
# NCCL_NVLS_ENABLE=0: nothing for NCCL to find there between "hosts" on one GPU). strata sets none
# of this itself; one rank per GPU needs none of it.
# The other variables already set by the caller win; a caller's NCCL_HOSTID
# gets the rank appended.
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-0}}}
export NCCL_HOSTID=${NCCL_HOSTID:-strata-test}-rank-$rank
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_MNNVL_ENABLE=${NCCL_MNNVL_ENABLE:-0} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
exec "$@"
