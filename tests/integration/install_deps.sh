#!/usr/bin/env bash
# install_deps: deploy/install-deps.sh while another package manager holds
# the dpkg lock (unattended-upgrades at boot, an apt in another terminal)
# waits for it and then succeeds, instead of failing at once. The lock is
# held the way apt and dpkg hold it (an fcntl write lock on
# /var/lib/dpkg/lock-frontend) until apt says it is waiting for it, and
# 1 s more, so the test does not race apt on a loaded machine (a fixed
# hold after the script's own message was spent before apt reached the
# lock, in CI); --all makes it hand apt the whole package list, installed
# packages left at their version, so apt runs (and needs the lock) on a
# ready machine too, without the network.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init install_deps
it_require python3 apt-get dpkg-query
[[ $(id -u) -eq 0 ]] || skip "needs root to take the dpkg lock and run apt-get"
LOCK=/var/lib/dpkg/lock-frontend
[[ -e $LOCK ]] || skip "no $LOCK: not a Debian-like system"
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../deploy" && pwd)/install-deps.sh

python3 - "$LOCK" "$IT_DIR/locked" "$IT_DIR/out.txt" <<'PY' &
import fcntl, os, sys, time
f = open(sys.argv[1], "w")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
open(sys.argv[2], "w").close()
end = time.monotonic() + 60
while time.monotonic() < end:
    try:
        if b"Could not get lock" in open(sys.argv[3], "rb").read():
            break
    except OSError:
        pass
    time.sleep(0.05)
time.sleep(1)
PY
HOLDER=$!
track "$HOLDER" lock-holder
until [[ -e $IT_DIR/locked ]]; do
  is_alive "$HOLDER" || skip "cannot take $LOCK (another package manager is at work)"
  sleep 0.05
done
t0=$(now_ms)
LYNX_APT_LOCK_WAIT=60 timeout -k 5 120 bash "$SCRIPT" --all >"$IT_DIR/out.txt" 2>&1
rc=$?
took=$(($(now_ms) - t0))
cat "$IT_DIR/out.txt" >&2
assert_eq "$rc" 0 "install-deps.sh --all exit status with the lock held until apt waited for it"
grep -q 'Could not get lock' "$IT_DIR/out.txt" ||
  it_check_failed "apt did not say it waited for the lock (held by the test)"
assert_ge "$took" 1000 "ms install-deps.sh took (it waited for the lock)"
wait_exit "$HOLDER" 10
exit 0
