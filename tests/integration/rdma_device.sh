#!/usr/bin/env bash
# rdma_device.sh - the rdma transport over a real RDMA device: runs
# lynx-rdma-conformance (tests/tools/rdma_conformance.c), which starts an
# agent side and frontend connections in one process through the real
# rdma_cm and verbs on the device's IPv4 address.
#
#   rdma_device.sh [bin dir]     (ctest -R rdma_device)
#
# Exits 77 (skip) with the reason when the machine has no RDMA device; to
# run it without RDMA hardware, add SoftRoCE first (docs/rdma.md):
#   modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0
# LYNX_RDMA_ADDR picks the address when the device's interface has several.
set -u
BIN=${1:-${LYNX_BIN_DIR:-$(dirname "$0")/../../build/bin}}
TOOL=$BIN/lynx-rdma-conformance

if [[ ! -x $TOOL ]]; then
  echo "rdma_device: $TOOL is not built" >&2
  exit 1
fi
if [[ ! -d /sys/class/infiniband ]] || [[ -z $(ls -A /sys/class/infiniband 2>/dev/null) ]]; then
  echo "rdma_device: SKIP: no RDMA device (/sys/class/infiniband is empty)."
  echo "  Add SoftRoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE"
  echo "  or run on RDMA hardware; see docs/rdma.md."
  exit 77
fi
echo "rdma_device: devices: $(ls /sys/class/infiniband | tr '\n' ' ')"
# the tool skips (77) too if ibv_get_device_list disagrees with sysfs
timeout --kill-after=5 90 "$TOOL"
