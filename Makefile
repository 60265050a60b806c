# Top-level driver: installs the Debian packages the goal needs that are
# missing (deps, below), configures CMake into build/ and builds. Any
# VAR=VALUE on the command line whose name starts with LYNX_ or CMAKE_ is
# passed to CMake (e.g. `make LYNX_SANITIZE=ON`).
BUILD ?= build
CMAKE_VARS := $(foreach v,$(filter LYNX_% CMAKE_%,$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),-D$(v)=$($(v))))
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build test test-busy test-faults test-arm64 deb fuzz run run-ha bench bench-scaleout bench-gpu bench-paper-gpu clean

all: build

# deploy/install-deps.sh's targets for the goals on the command line (all
# of theirs for several): run (the build, and sockperf and curl for make
# run's demo) for make, build, run and every goal not named here; the test
# tools for the suites, clang for fuzz, and so on. LYNX_ARCH=arm64 adds
# arm64. `deploy/install-deps.sh --help` lists each target's packages.
DEPS_test := test
DEPS_test-faults := test
DEPS_test-busy := test
DEPS_run-ha := run-ha
DEPS_fuzz := fuzz
DEPS_deb := deb
$(foreach g,bench bench-scaleout bench-gpu bench-paper-gpu,$(eval DEPS_$(g) := bench))
DEPS_TARGETS := $(sort $(foreach g,$(or $(MAKECMDGOALS),all),$(or $(DEPS_$(g)),run)) \
                $(if $(filter arm64,$(LYNX_ARCH)),arm64))

deps:
	@bash deploy/install-deps.sh $(DEPS_TARGETS)

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_VARS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1 $(CTEST_ARGS)

# the fault suite alone (tests/faults/, docs/faults.md; also in `test`)
test-faults: build
	cd $(BUILD) && ctest --output-on-failure -j 1 -L faults $(CTEST_ARGS)

# arm64 (BlueField, docs/bluefield.md): cross-compiled into ARM64_BUILD,
# then the unit tests (the ring's two-thread test with a million requests)
# and the UDP ping-pong, TCP service and coordinator integration tests run
# the arm64 programs under qemu-user
ARM64_BUILD ?= build-arm64
ARM64_TESTS ?= ^(emu_wrappers|integration\.(udp_pingpong|tcp_service|cluster))$$
test-arm64:
	@bash deploy/install-deps.sh arm64
	@cmake -S . -B $(ARM64_BUILD) -DLYNX_ARCH=arm64 >/dev/null
	@cmake --build $(ARM64_BUILD) -j $(JOBS)
	cd $(ARM64_BUILD) && LYNX_UT_RING_ITERS=1000000 ctest --output-on-failure -j 1 -L unit $(CTEST_ARGS)
	cd $(ARM64_BUILD) && ctest --output-on-failure -j 1 -R '$(ARM64_TESTS)' $(CTEST_ARGS)

# Debian packages of the build (deploy/packaging.cmake): lynx-coordinator,
# lynx-agent, lynx-frontend, lynxctl in $(BUILD)/packages/; for arm64:
# make deb BUILD=build-arm64 LYNX_ARCH=arm64
deb: build
	cd $(BUILD) && cpack -G DEB
	@ls -l $(BUILD)/packages/*.deb

# the suite with a CPU hog per core spinning beside it (tests/run-busy.sh)
test-busy: build
	@bash tests/run-busy.sh $(BUILD) $(CTEST_ARGS)

# every libFuzzer harness of tests/fuzz/ for FUZZ_SECONDS each, from a
# scratch copy of its corpus, in a clang build (FUZZ_BUILD); fails when one
# crashed, keeping the input in FUZZ_BUILD/fuzz-artifacts/ (docs/fuzzing.md).
# FUZZ_HARNESSES="a b" runs only those.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES ?=
fuzz: deps
	@LYNX_FUZZ_JOBS=$(JOBS) bash tests/fuzz/build-libfuzzer.sh . $(FUZZ_BUILD) || \
	  { echo "make fuzz: no libFuzzer build (see above)" >&2; exit 1; }
	@bash tests/fuzz/fuzz-run.sh $(FUZZ_BUILD)/bin $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

run: build
	@bash deploy/run-local.sh $(BUILD)

# run with 3 etcd members and 3 coordinators (docs/etcd.md)
run-ha: build
	@bash deploy/run-ha.sh $(BUILD)

bench: build
	@bash bench/udp-echo.sh $(BUILD)

bench-scaleout: build
	@bash bench/scaleout.sh $(BUILD)

# on a GPU host, built with LYNX_CUDA=ON (bench/gpu.sh)
bench-gpu: build
	@bash bench/gpu.sh $(BUILD)

# the paper's GPU experiments, on a GPU host (bench/paper-gpu.sh)
bench-paper-gpu: build
	@bash bench/paper-gpu.sh $(BUILD)

clean:
	rm -rf $(BUILD)
