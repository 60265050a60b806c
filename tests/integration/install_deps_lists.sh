#!/usr/bin/env bash
# install_deps_lists: each make goal installs what it needs and no more, and
# nothing deploy/install-deps.sh installs replaces the init system (issue
# 32: the first `make run` installed Chromium, etcd, Prometheus, ... and,
# through Chromium's D-Bus, systemd-sysv, the init of a container or a
# minimal VM).
#
#  1. `install-deps.sh --list run` (and build) holds none of the packages
#     only the tests, fuzzing, packaging, make run-ha or arm64 need, and
#     holds sockperf and curl, which make run's banner has the user run.
#  2. The Makefile: `make -n GOAL` calls install-deps.sh with GOAL's
#     target only: make, make build and make run with run, make test with
#     test, make fuzz with fuzz, make deb with deb, make run-ha with run-ha,
#     make test-arm64 with arm64.
#  3. The script (apt-get, dpkg-query and sudo replaced by fakes on PATH:
#     nothing is installed) with nothing installed: one `apt-get install`
#     of exactly the run list, saying "install-deps (run): installing
#     ..."; with the run list installed: no apt call, no word, exit 0.
#  4. Every target's list, and the one with no target, resolved by apt as
#     on a fresh machine (an empty dpkg status, no Recommends, apt's local
#     indexes: no network, nothing on this machine touched): apt finds
#     every package, and installs neither systemd-sysv nor any other init
#     (the alternatives of Debian's `init` package, what provides them);
#     run's resolved set holds none of the packages of 1 either. Targets
#     with :arm64 packages are resolved without those when apt has no arm64
#     index (said in the log). Skipped (77) without apt's indexes.
#
# LYNX_INSTALL_DEPS: the script to check (default: deploy/install-deps.sh).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init install_deps_lists
it_require make apt-get apt-cache dpkg
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCRIPT=${LYNX_INSTALL_DEPS:-$SRC/deploy/install-deps.sh}
IT_SOFT=1 # report every list that is wrong
W=$IT_DIR/w # the lists and apt's output: not printed with the logs
mkdir -p "$W"
TARGETS=(build run run-ha test fuzz deb bench lenet arm64)

# only for the tests, fuzzing, packaging, etcd or arm64: never in run's list
NOT_RUN=(chromium chromium-driver python3-selenium dbus-x11 debootstrap gnutls-bin
  faketime etcd-server etcd-client prometheus systemd systemd-sysv clang clang-14
  libclang-rt-dev libclang-rt-14-dev memcached jq python3-yaml python3-jsonschema
  dataset-fashion-mnist python3-numpy qemu-user-static crossbuild-essential-arm64)

# list TARGET...: the script's packages for the targets, one a line
list() {
  local out rc=0
  out=$(bash "$SCRIPT" --list "$@" 2>&1) || rc=$?
  if ((rc != 0)); then
    it_check_failed "install-deps.sh --list $* failed ($rc): $(head -c 300 <<<"$out")"
    return 1
  fi
  [[ -n $out ]] || { it_check_failed "install-deps.sh --list $* is empty"; return 1; }
  printf '%s\n' "$out"
}
# none_of WHAT LIST-FILE: LIST-FILE (one name a line) holds none of NOT_RUN
none_of() {
  local p bad=()
  for p in "${NOT_RUN[@]}"; do grep -qx -- "$p" "$2" && bad+=("$p"); done
  ((${#bad[@]} == 0)) || { it_check_failed "$1 holds ${bad[*]}"; return 1; }
  log "ok: $1 holds none of the test, fuzz, packaging, etcd or arm64 packages"
}

# ---- 1. run's list --------------------------------------------------------------
for t in build run; do
  list "$t" >"$W/list-$t" || continue
  none_of "install-deps.sh's $t list ($(wc -l <"$W/list-$t") packages)" "$W/list-$t"
done
for p in sockperf curl; do
  if grep -qx "$p" "$W/list-run" 2>/dev/null; then
    log "ok: run's list holds $p (make run's banner runs it)"
  else
    it_check_failed "run's list lacks $p, which make run's banner tells the user to run"
  fi
done

# ---- 2. the Makefile's goals -------------------------------------------------------
# (none): make with no goal
declare -A GOAL_TARGET=([none]=run [build]=run [run]=run [test]=test [test-all]=test
  [test-sanitize]=test [test-faults]=test [test-busy]=test
  [fuzz]=fuzz [deb]=deb [run-ha]=run-ha [test-arm64]=arm64)
for g in none build run test test-all test-sanitize test-faults test-busy fuzz deb run-ha test-arm64; do
  goal=() what="make $g"
  [[ $g == none ]] && what="make (no goal)" || goal=("$g")
  calls=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES \
    make -n -C "$SRC" "${goal[@]}" BUILD="$IT_DIR/no-build" FUZZ_BUILD="$IT_DIR/no-fuzz" \
    ARM64_BUILD="$IT_DIR/no-arm64" SANITIZE_BUILD="$IT_DIR/no-asan" 2>&1 | grep -E '(^|[ /])install-deps\.sh( |$)')
  n=$(grep -c . <<<"$calls")
  if ((n != 1)); then
    it_check_failed "make -n for $what: $n install-deps.sh calls: $calls"
    continue
  fi
  args=$(sed -E 's/.*install-deps\.sh *//' <<<"$calls")
  assert_str "$args" "${GOAL_TARGET[$g]}" "install-deps.sh's targets for $what"
done

# ---- 3. what the script hands apt -------------------------------------------------
FAKE=$IT_DIR/fake
mkdir -p "$FAKE"
cat >"$FAKE/apt-get" <<'EOF'
#!/bin/sh
echo "$*" >>"$FAKE_LOG"
EOF
cat >"$FAKE/dpkg-query" <<'EOF'
#!/bin/sh
[ -f "$FAKE_INSTALLED" ] && sed 's/^\(.*\)$/install ok installed \1 all/' "$FAKE_INSTALLED"
exit 0
EOF
printf '#!/bin/sh\nexec "$@"\n' >"$FAKE/sudo"
chmod +x "$FAKE"/*
# fake_run OUT TARGET...: the script with the fakes; its status in FAKE_RC
fake_run() {
  local out=$1
  shift
  : >"$IT_DIR/apt.log"
  FAKE_RC=0
  PATH=$FAKE:$PATH FAKE_LOG=$IT_DIR/apt.log FAKE_INSTALLED=$W/installed \
    LYNX_APT_LOCK_WAIT=1 timeout 30 bash "$SCRIPT" "$@" >"$out" 2>&1 || FAKE_RC=$?
}
if [[ -s $W/list-run ]]; then
  rm -f "$W/installed"
  fake_run "$IT_DIR/fake-empty.out" run
  assert_eq "$FAKE_RC" 0 "install-deps.sh run (nothing installed, apt faked) exit status"
  want="-o DPkg::Lock::Timeout=1 install -y --no-install-recommends $(tr '\n' ' ' <"$W/list-run")"
  assert_str "$(cat "$IT_DIR/apt.log")" "${want% }" "what install-deps.sh run hands apt-get on a bare machine"
  assert_log "$IT_DIR/fake-empty.out" "install-deps (run): installing $(tr '\n' ' ' <"$W/list-run" | sed 's/ $//')" \
    "install-deps.sh says for which target and what it installs"
  cp "$W/list-run" "$W/installed"
  fake_run "$IT_DIR/fake-ready.out" run
  assert_eq "$FAKE_RC" 0 "install-deps.sh run (all installed) exit status"
  if [[ -s $IT_DIR/apt.log ]]; then
    it_check_failed "install-deps.sh run called apt-get on a ready machine: $(cat "$IT_DIR/apt.log")"
  elif [[ -s $IT_DIR/fake-ready.out ]]; then
    it_check_failed "install-deps.sh run said something on a ready machine: $(cat "$IT_DIR/fake-ready.out")"
  else
    log "ok: on a ready machine install-deps.sh run calls no apt and says nothing"
  fi
fi

# ---- 4. resolved by apt as on a fresh machine --------------------------------------
compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null ||
  { ((IT_NFAIL == 0)) || it_done; skip "no local apt indexes in /var/lib/apt/lists (apt-get update has not run): the lists cannot be resolved"; }
APT_DIR=$W/apt
mkdir -p "$APT_DIR/archives/partial"
: >"$APT_DIR/status"
APT=(apt-get -qq -o Dir::State::status="$APT_DIR/status"
  -o Dir::State::extended_states="$APT_DIR/extended_states"
  -o Dir::Cache::pkgcache="$APT_DIR/pkgcache.bin" -o Dir::Cache::srcpkgcache="$APT_DIR/srcpkgcache.bin"
  -o Dir::Cache::archives="$APT_DIR/archives/" -o Debug::NoLocking=1)
HAVE_ARM64_INDEX=0
compgen -G "/var/lib/apt/lists/*_binary-arm64_Packages*" >/dev/null && HAVE_ARM64_INDEX=1

# the inits: the alternatives of Debian's `init` package, the usual ones
# should `init` be unknown, and what provides any of them
declare -A INIT=([systemd-sysv]=1 [sysvinit-core]=1 [runit-init]=1)
APT_CACHE=(apt-cache "${APT[@]:2}")
for p in $("${APT_CACHE[@]}" depends init 2>/dev/null |
  sed -n 's/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: *\([^ <>]*\)$/\2/p'); do
  INIT[$p]=1
done
for p in $("${APT_CACHE[@]}" showpkg "${!INIT[@]}" 2>/dev/null |
  awk '/^Package: / { rp = 0 } /^Reverse Provides:/ { rp = 1; next } rp && NF { print $1 }'); do
  INIT[$p]=1
done
log "init packages: ${!INIT[*]}"

# resolve NAME PKG...: what apt installs for PKG on a fresh machine, one name
# a line, into $W/resolved-NAME
resolve() {
  local name=$1 out=$W/resolved-$1 rc=0
  shift
  "${APT[@]}" -o Debug::pkgDepCache::AutoInstall=1 install --print-uris --no-install-recommends "$@" \
    >"$out.uris" 2>"$out.err" || rc=$?
  if ((rc != 0)); then
    it_check_failed "apt cannot install $name's list on a fresh machine ($rc): $(grep -E '^(E|W): ' "$out.err" | head -c 600)"
    return 1
  fi
  awk '{ sub(/_.*/, "", $2); print $2 }' "$out.uris" | sort -u >"$out"
  log "$name: apt installs $(wc -l <"$out") packages, $(awk '{ s += $3 } END { printf "%.1f", s / 1e6 }' "$out.uris") MB to download, on a fresh machine"
}
# why NAME "INIT...": the chains of dependencies by which apt installs each
# INIT for NAME's list, as "a <- b <- c" (apt's own account of its choices,
# in resolve's debug output)
why() {
  awk -v names="$2" '
    match($0, /Installing [^ ]+ as [^ ]+ of [^ ]+/) {
      split(substr($0, RSTART, RLENGTH), w, " ")
      sub(/:.*/, "", w[2]); sub(/:.*/, "", w[6])
      if (!(w[2] in by)) by[w[2]] = w[6]
    }
    END {
      n = split(names, want, " ")
      for (i = 1; i <= n; i++) {
        c = want[i]; p = want[i]
        for (k = 0; k < 30 && (p in by); k++) { p = by[p]; c = c " <- " p }
        printf "%s%s", (i > 1 ? "; " : ""), c
      }
    }' "$W/resolved-$1.err"
}
t0=$(now_ms)
for t in "${TARGETS[@]}" ""; do
  name=${t:-no-target}
  list ${t:+"$t"} >"$W/list-$name" || continue
  pkgs=()
  while read -r p; do
    if [[ $p == *:arm64 ]] && ((!HAVE_ARM64_INDEX)); then continue; fi
    pkgs+=("$p")
  done <"$W/list-$name"
  skipped=$(($(wc -l <"$W/list-$name") - ${#pkgs[@]}))
  ((skipped == 0)) || log "$name: its $skipped :arm64 packages left out (apt has no arm64 index here: dpkg --add-architecture arm64 and apt-get update give one)"
  resolve "$name" "${pkgs[@]}" || continue
  inits=()
  while read -r p; do [[ -n ${INIT[$p]:-} ]] && inits+=("$p"); done <"$W/resolved-$name"
  if ((${#inits[@]})); then
    it_check_failed "${t:-the no-target} list pulls an init system on a fresh machine: $(why "$name" "${inits[*]}")"
  else
    log "ok: ${t:-the no-target} list pulls no init system"
  fi
done
[[ -s $W/resolved-run ]] &&
  none_of "what apt installs for run on a fresh machine" "$W/resolved-run"
log "resolving every list took $(($(now_ms) - t0)) ms"
it_done
