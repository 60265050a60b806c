#!/usr/bin/env bash
# plugin_sdk: a user's own application served without forking Lynx-C
# (docs/writing-apps.md).
#
#  1. The SDK installs (cmake --install, component dev, into a root of its
#     own): headers, lynx.pc, the CMake package, the examples. The example
#     kv-lookup builds from that root with pkg-config alone (its Makefile),
#     and again with find_package(Lynx) (its CMakeLists.txt); nothing of
#     the source tree is on either compiler's command line.
#  2. An agent loads it (--app-load) beside bad plug-ins: one built for
#     another ABI, one without the entry, one taking a built-in's name, one
#     for another architecture, one whose constructor aborts. It refuses
#     each with its reason (--list-apps), registers, and keeps running what
#     it loaded, each plug-in in a process of its own.
#  3. Two services of the plug-in through the API and lynxctl, each with
#     its own app configuration (a table inline, a table in a file): every
#     answer checked, hits and misses, against the service's own table.
#  4. A configuration the application refuses: the service is pending with
#     the application's reason; a configuration that is not an object is
#     refused by the API.
#  5. A service of a refused plug-in is taken and says which node refused
#     it and why; the node's refusals are in GET /v1/nodes/ID.
#  5b. The GPU example (a fatbin, vector-sum) builds from the SDK with its
#     Makefile (pkg-config and nvcc alone, sm_80 and sm_90); an agent
#     without a GPU refuses it with that reason, shown on its service.
#  6. Static mode: --app of a plug-in with --app-config (one that is not an
#     object, or given with --coordinator, is refused at start); killed
#     with SIGKILL, the agent takes its plug-in's process with it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init plugin_sdk
it_require_coord
it_require python3 pkg-config cc cmake make jq
pick_ports COORD_PORT API_PORT METRICS_PORT P_FRUIT P_CODES P_BROKEN P_FUTURE P_VSUM
IT_SOFT=1

BUILD=$(cd "$LYNX_BIN_DIR/.." && pwd)
PLUGINS=$BUILD/plugins
for p in plugin-bad-abi plugin-no-entry plugin-clash plugin-crash-load; do
  [[ -f $PLUGINS/$p.so ]] || fail "$PLUGINS/$p.so is missing: build first (make)"
done

# ---- 1. the SDK, installed; the example built from it alone --------------------
log "== 1. the SDK installs; kv-lookup builds against it"
ROOT=$IT_DIR/root
DESTDIR=$ROOT cmake --install "$BUILD" --component dev --prefix /usr >"$IT_DIR/install.log" 2>&1 ||
  fail "cmake --install --component dev: $(tail -5 "$IT_DIR/install.log")"
for f in include/lynx/lynx_app.h include/lynx/lynx_io.h include/lynx/mqueue.h \
  include/lynx/lynx_gpu.h include/lynx/lynx_kernel.cuh include/lynx/lynx_dev.cuh \
  include/lynx/lathist.h include/lynx/lynx_call.h \
  share/doc/lynx-dev/examples/vector-sum-gpu/vector_sum.cu \
  share/pkgconfig/lynx.pc share/cmake/Lynx/LynxConfig.cmake \
  share/cmake/Lynx/LynxConfigVersion.cmake share/doc/lynx-dev/writing-apps.md \
  share/doc/lynx-dev/examples/kv-lookup/kv_lookup.c; do
  [[ -f $ROOT/usr/$f ]] || it_check_failed "the SDK lacks /usr/$f"
done
export PKG_CONFIG_PATH=$ROOT/usr/share/pkgconfig
cflags=$(pkg-config --cflags lynx) || fail "pkg-config --cflags lynx: $(pkg-config --cflags lynx 2>&1)"
[[ $cflags == *"$ROOT/usr/"*include* && $cflags != *"$(cd "$BUILD/.." && pwd)"* ]] ||
  it_check_failed "pkg-config --cflags lynx is not the installed root's: $cflags"
log "ok: pkg-config --cflags lynx: $cflags; version $(pkg-config --modversion lynx)"
cp -r "$ROOT/usr/share/doc/lynx-dev/examples/kv-lookup" "$IT_DIR/kv-make"
make -C "$IT_DIR/kv-make" >"$IT_DIR/make.log" 2>&1 ||
  fail "the example's Makefile (pkg-config): $(tail -20 "$IT_DIR/make.log")"
grep -q -- "-I$ROOT/usr/share/pkgconfig/../../include\|-I$ROOT/usr/include" "$IT_DIR/make.log" ||
  it_check_failed "the example was not compiled against the installed headers: $(cat "$IT_DIR/make.log")"
KV_SO=$IT_DIR/kv-make/kv-lookup.so
nm -D --defined-only "$KV_SO" | grep -q ' T lynx_app_entry$' ||
  it_check_failed "kv-lookup.so does not export lynx_app_entry"
if ! cmake -S "$ROOT/usr/share/doc/lynx-dev/examples/kv-lookup" -B "$IT_DIR/kv-cmake" \
  -DCMAKE_PREFIX_PATH="$ROOT/usr" >"$IT_DIR/cmake.log" 2>&1 ||
  ! cmake --build "$IT_DIR/kv-cmake" >>"$IT_DIR/cmake.log" 2>&1; then
  fail "the example's CMakeLists.txt (find_package(Lynx)): $(tail -20 "$IT_DIR/cmake.log")"
fi
[[ -f $IT_DIR/kv-cmake/kv-lookup.so ]] || it_check_failed "find_package(Lynx) built no kv-lookup.so"
log "ok: kv-lookup.so built with pkg-config and with find_package(Lynx)"
# the GPU example, a fatbin for sm_80 and sm_90, from the SDK alone
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
VS_FATBIN=$PLUGINS/vector-sum.fatbin
if [[ -x $NVCC ]]; then
  cp -r "$ROOT/usr/share/doc/lynx-dev/examples/vector-sum-gpu" "$IT_DIR/vs-make"
  make -C "$IT_DIR/vs-make" NVCC="$NVCC" >"$IT_DIR/vs-make.log" 2>&1 ||
    fail "the GPU example's Makefile (pkg-config): $(tail -20 "$IT_DIR/vs-make.log")"
  grep -q -- "-I$ROOT/usr/share/pkgconfig/../../include\|-I$ROOT/usr/include" "$IT_DIR/vs-make.log" ||
    it_check_failed "the GPU example was not compiled against the installed headers: $(cat "$IT_DIR/vs-make.log")"
  VS_FATBIN=$IT_DIR/vs-make/vector-sum.fatbin
  # its entries: a cubin (kind 2) for each architecture asked for
  code=$(python3 - "$VS_FATBIN" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
magic, _, hs, size = struct.unpack_from("<IHHQ", d, 0)
assert magic == 0xBA55ED50, "not a fatbin"
o, code = hs, []
while o < hs + size:
    kind, _, ehs, n = struct.unpack_from("<HHIQ", d, o)
    arch, = struct.unpack_from("<I", d, o + 28)
    code.append(("sm_%d" if kind == 2 else "compute_%d") % arch)
    o += ehs + n
print(",".join(sorted(code)))
PY
)
  assert_str "$code" "sm_80,sm_90" "vector-sum.fatbin's code, built by its Makefile"
  for s in lynx_gpu_app_info lynx_gpu_kernel lynx_gpu_kernel_wide; do
    grep -qa "$s" "$VS_FATBIN" || it_check_failed "vector-sum.fatbin has no $s"
  done
  log "ok: vector-sum.fatbin built with pkg-config and nvcc ($code)"
else
  log "no nvcc: the GPU example is not built here (the tree's own build of it is loaded below)"
fi
[[ -f $VS_FATBIN ]] || log "no vector-sum.fatbin (a build without CUDA): its refusal is not checked"

# ---- 2. loaded beside bad plug-ins ------------------------------------------------
log "== 2. the agent loads it and refuses the bad ones"
# the plug-in again, for an architecture this host is not
python3 - "$KV_SO" "$IT_DIR/kv-other-arch.so" <<'PY'
import platform, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<H", b, 18, 62 if platform.machine() == "aarch64" else 183)
open(sys.argv[2], "wb").write(b)
PY
LOADS="kv-lookup=$KV_SO,$PLUGINS/plugin-bad-abi.so,$PLUGINS/plugin-no-entry.so,$PLUGINS/plugin-clash.so,kv-other=$IT_DIR/kv-other-arch.so,$PLUGINS/plugin-crash-load.so"
# the GPU module too: an agent without a GPU refuses it, saying so
REFUSED=echo,future-abi,kv-other,plugin-crash-load,plugin-no-entry
if [[ -f $VS_FATBIN ]]; then
  LOADS+=",vector-sum=$VS_FATBIN"
  REFUSED=echo,future-abi,kv-other,plugin-crash-load,plugin-no-entry,vector-sum
fi
"$LYNX_BIN_DIR/lynx-agent" --list-apps --app-load "$LOADS" >"$IT_DIR/list.out" 2>"$IT_DIR/list.err" ||
  it_check_failed "lynx-agent --list-apps: exit $?: $(cat "$IT_DIR/list.err")"
want_line() {
  grep -qF -- "$1" "$IT_DIR/list.out" || it_check_failed "--list-apps has no line with '$1': $(cat "$IT_DIR/list.out")"
}
want_line "$(printf 'kv-lookup\t%s\t-\tno' "$KV_SO")"
want_line "$(printf 'lenet\tbuilt in\t-\tyes')"
want_line "$(printf 'refused\tfuture-abi\t%s' "built for plug-in ABI version 2; this agent runs version 1")"
want_line "$(printf 'refused\tplugin-no-entry\tno lynx_app_entry: not a Lynx plug-in')"
want_line "$(printf 'refused\techo\t%s' "'echo' is the name of a built-in application")"
want_line "refused	kv-other	a shared object for "
want_line "$(printf 'refused\tplugin-crash-load\tits process killed by signal 6 (Aborted) while loading it')"
[[ ! -f $VS_FATBIN ]] || want_line "$(printf 'vector-sum\t%s\t-\tonly' "$VS_FATBIN")"
log "ok: --list-apps: $(grep -c . "$IT_DIR/list.out") lines, $(grep -c ^refused "$IT_DIR/list.out") refused"
# each loaded plug-in in a process of its own, gone with the agent
[[ -z $(pgrep -f -- "--app-host $KV_SO") ]] || it_check_failed "--list-apps left kv-lookup's process running"

start_coordinator
node_ids N1
start_node_agent "$N1" --cpu-accels 1 --app-load "$LOADS"
assert_log "$AGENT_LOG" "application 'kv-lookup' loaded from $KV_SO" "the agent's log names the plug-in it loaded"
assert_log "$AGENT_LOG" "plug-in refused: $PLUGINS/plugin-bad-abi.so: built for plug-in ABI version 2" \
  "the agent's log says why it refused the other ABI's"
start_coord_frontend
[[ $(pgrep -fc -- "--app-host $KV_SO") == 1 ]] || it_check_failed "kv-lookup does not run in a process of its own"
[[ $(api_json "/v1/nodes/$N1" '[.accelerators[0].apps[]] | index("kv-lookup") != null') == true ]] ||
  it_check_failed "the node does not list kv-lookup among its accelerator's apps: $(api_json "/v1/nodes/$N1" .accelerators)"
[[ $(api_json "/v1/nodes/$N1" '[.refused_apps[].name] | sort | join(",")') == "$REFUSED" ]] ||
  it_check_failed "GET /v1/nodes/$N1: refused_apps: $(api_json "/v1/nodes/$N1" .refused_apps)"

# ---- 3. two services, two tables --------------------------------------------------
log "== 3. services of the plug-in, each configured its own way"
python3 - "$IT_DIR/codes.tsv" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("# country codes\n")
    for i in range(300):
        f.write("c%03d\tcountry number %d\n" % (i, i))
PY
serve_service fruit "\"port\":$P_FRUIT,\"app\":\"kv-lookup\",\"app_config\":{\"entries\":{\"apple\":\"red\",\"kiwi\":\"green\",\"plum\":\"purple\"},\"miss\":\"NOT_FOUND\"}"
[[ $(svc fruit '.app_config.entries.kiwi') == green ]] ||
  it_check_failed "GET /v1/services/fruit does not carry its app_config: $(svc fruit .)"
ctl service create --name codes --port "$P_CODES" --app kv-lookup \
  --app-config "{\"file\": \"$IT_DIR/codes.tsv\"}" >"$IT_DIR/ctl-create.out" 2>&1 ||
  it_check_failed "lynxctl service create --app-config: $(cat "$IT_DIR/ctl-create.out")"
wait_log "$FRONTEND_LOG" "serving service codes" 5 1 "$FRONTEND_PID"
ctl service show codes >"$IT_DIR/ctl-show.out" 2>&1
grep -q "^app-config: .*codes.tsv" "$IT_DIR/ctl-show.out" ||
  it_check_failed "lynxctl service show: no app-config line: $(cat "$IT_DIR/ctl-show.out")"
wait_svc fruit '.state == "ready"' 10
wait_svc codes '.state == "ready"' 10

# ask PORT: sends each key of stdin (KEY<TAB>WANT per line) and checks the
# answer; prints "asked N right N"
cat >"$IT_DIR/ask.py" <<'PY'
import socket, sys
port = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
asked = right = 0
for line in sys.stdin.read().splitlines():
    key, want = line.split("\t", 1)
    for attempt in range(3):  # UDP: a datagram may be lost, never wrong
        s.sendto(key.encode(), ("127.0.0.1", port))
        try:
            got = s.recv(65536).decode()
            break
        except socket.timeout:
            got = None
    asked += 1
    if got == want:
        right += 1
    else:
        print("key %r: answer %r, want %r" % (key, got, want), file=sys.stderr)
print("asked %d right %d" % (asked, right))
PY
ask() { python3 "$IT_DIR/ask.py" "$1"; }
out=$(printf 'apple\tred\nkiwi\tgreen\nplum\tpurple\npear\tNOT_FOUND\nc001\tNOT_FOUND\nkiwi\tgreen\n' | ask "$P_FRUIT")
assert_str "$out" "asked 6 right 6" "fruit: answers from its inline table"
out=$( { for i in $(seq 0 7 299); do printf 'c%03d\tcountry number %d\n' "$i" "$i"; done; printf 'apple\t\nc300\t\n'; } | ask "$P_CODES")
assert_str "$out" "asked 45 right 45" "codes: answers from its file's table, empty ones for misses"
log "ok: both services answer from their own tables"

# ---- 4. configurations that do not fit ----------------------------------------------
log "== 4. a configuration the application refuses, one the API refuses"
api POST /v1/services -d "{\"name\":\"broken\",\"port\":$P_BROKEN,\"app\":\"kv-lookup\",\"app_config\":{\"entries\":{},\"colour\":1}}"
assert_eq "$API_STATUS" 201 "POST a kv-lookup service whose configuration it refuses: HTTP status"
wait_svc broken '.state == "pending" and (.reason | contains("kv-lookup: configuration: '"'"'colour'"'"'"))' 10
log "ok: broken: $(svc broken '.state + ": " + .reason')"
api DELETE /v1/services/broken
api POST /v1/services -d "{\"name\":\"notobj\",\"port\":$P_BROKEN,\"app\":\"kv-lookup\",\"app_config\":[1,2]}"
assert_eq "$API_STATUS" 400 "POST with an app_config that is not an object: HTTP status"
[[ $(jq -r .error.message "$API_BODY") == *"app_config: must be a JSON object"* ]] ||
  it_check_failed "the API's refusal does not name app_config: $(cat "$API_BODY")"

# ---- 5. a service of a refused plug-in -------------------------------------------------
log "== 5. a service of the plug-in the agent refused"
api POST /v1/services -d "{\"name\":\"future\",\"port\":$P_FUTURE,\"app\":\"future-abi\"}"
assert_eq "$API_STATUS" 201 "POST a service of a refused plug-in: HTTP status (it says why)"
wait_svc future '.state == "pending" and (.reason | contains("node '"$N1"' refused the plug-in of application '"'"'future-abi'"'"': built for plug-in ABI version 2"))' 5
log "ok: future: $(svc future '.state + ": " + .reason')"
if [[ -f $VS_FATBIN ]]; then
  api POST /v1/services -d "{\"name\":\"vsum\",\"port\":$P_VSUM,\"app\":\"vector-sum\"}"
  assert_eq "$API_STATUS" 201 "POST a service of a GPU application on a node without a GPU: HTTP status"
  wait_svc vsum '.state == "pending" and (.reason | contains("node '"$N1"' refused the plug-in of application '"'"'vector-sum'"'"': a GPU application (a CUDA module), and this agent has no GPU"))' 5
  log "ok: vsum: $(svc vsum '.state + ": " + .reason')"
  api DELETE /v1/services/vsum
fi
# an app nobody has heard of is still refused at once
api POST /v1/services -d "{\"name\":\"ghost\",\"port\":$P_FUTURE,\"app\":\"no-such-app\"}"
assert_eq "$API_STATUS" 422 "POST a service of an app no agent loads or refused: HTTP status"
# and through all of it the plug-in's services answered
out=$(printf 'plum\tpurple\n' | ask "$P_FRUIT")
assert_str "$out" "asked 1 right 1" "fruit still answers"

# ---- 6. static mode ---------------------------------------------------------------
log "== 6. static mode"
for bad in "[1]" "{\"a\":"; do
  "$LYNX_BIN_DIR/lynx-agent" --app kv-lookup --app-load "$KV_SO" --app-config "$bad" \
    >"$IT_DIR/badcfg.out" 2>&1
  assert_eq $? 2 "--app-config '$bad': exit status (usage)"
  assert_log "$IT_DIR/badcfg.out" "--app-config: not a JSON object" "--app-config '$bad': the reason"
done
"$LYNX_BIN_DIR/lynx-agent" --coordinator "127.0.0.1:$COORD_PORT" --app-config '{}' \
  >"$IT_DIR/badcfg.out" 2>&1
assert_eq $? 2 "--app-config with --coordinator: exit status (usage)"
assert_log "$IT_DIR/badcfg.out" "under a coordinator each service carries its own" "--app-config with --coordinator: the reason"
pick_ports AGENT_PORT UDP_PORT METRICS2
METRICS_PORT=$METRICS2
start_agent --cpu-accels 1 --app kv-lookup --app-load "$KV_SO" \
  --app-config '{"entries": {"x": "static"}, "miss": "none"}'
start_frontend
out=$(printf 'x\tstatic\nq\tnone\n' | ask "$UDP_PORT")
assert_str "$out" "asked 2 right 2" "static mode: the plug-in answers with --app-config's table"
kids=$(pgrep -P "$AGENT_PID" | tr '\n' ' ')
[[ -n $kids ]] || it_check_failed "the static agent has no plug-in process"
kill9 "$AGENT_PID"
end=$(($(now_ms) + $(ts_ms 3000)))
for k in $kids; do
  while is_alive "$k" && (($(now_ms) < end)); do sleep 0.05; done
  ! is_alive "$k" || it_check_failed "plug-in process $k outlived its agent (SIGKILL)"
done
log "ok: the plug-in's process ($kids) died with its agent"
it_done
