# Top-level driver: installs the Debian packages the goal needs that are
# missing (deps, below), configures CMake into build/ and builds. Any
# VAR=VALUE on the command line whose name starts with LYNX_ or CMAKE_ is
# passed to CMake (e.g. `make LYNX_SANITIZE=ON`).
BUILD ?= build
CMAKE_VARS := $(foreach v,$(filter LYNX_% CMAKE_%,$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),-D$(v)=$($(v))))
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build test lint gpu-prove gpu-figures test-all test-sanitize test-busy test-faults test-arm64 deb fuzz run run-ha bench bench-scaleout bench-gpu bench-paper-gpu clean

all: build

# deploy/install-deps.sh's targets for the goals on the command line (all
# of theirs for several): run (the build, and sockperf and curl for make
# run's demo) for make, build, run and every goal not named here; the test
# tools for the suites, clang for fuzz, and so on. LYNX_ARCH=arm64 adds
# arm64. `deploy/install-deps.sh --help` lists each target's packages.
$(foreach g,test lint test-all test-sanitize test-faults test-busy,$(eval DEPS_$(g) := test))
DEPS_run-ha := run-ha
DEPS_fuzz := fuzz
DEPS_deb := deb
$(foreach g,bench bench-scaleout bench-gpu bench-paper-gpu gpu-prove gpu-figures,$(eval DEPS_$(g) := bench))
DEPS_TARGETS := $(sort $(foreach g,$(or $(MAKECMDGOALS),all),$(or $(DEPS_$(g)),run)) \
                $(if $(filter arm64,$(LYNX_ARCH)),arm64))

deps:
	@bash deploy/install-deps.sh $(DEPS_TARGETS)

# The tests' time scale (docs/testing.md): auto (1; 2 in a sanitizer
# build, 5 in a cross build), or a whole number; make test-busy uses 3.
LYNX_TEST_TIME_SCALE ?= auto
configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_VARS) -DLYNX_TEST_TIME_SCALE=$(LYNX_TEST_TIME_SCALE) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The tests (docs/testing.md). $(call ctest_stage,BUILD,NAME,CTEST ARGS)
# runs ctest in BUILD, TEST_JOBS tests at a time (the integration tests
# run alone: RUN_SERIAL), its JUnit report in BUILD/junit-NAME.xml; then
# tests/check-skips.py lists every skip with its reason, and with
# LYNX_STRICT_SKIPS=1 (CI) fails on one tests/skips.allow does not hold.
# LYNX_TEST_EXTRA=host also runs the tests that change the machine
# (install_deps takes the dpkg lock, deb_install fetches a Debian root).
TEST_JOBS ?= $(JOBS)
export LYNX_TEST_EXTRA LYNX_STRICT_SKIPS LYNX_GPU_HOST
ctest_stage = cd $(1) && ctest --output-on-failure -j $(TEST_JOBS) \
  --output-junit $(abspath $(1))/junit-$(2).xml $(3) $(CTEST_ARGS); rc=$$?; \
  cd $(CURDIR) && python3 tests/check-skips.py $(1) $(abspath $(1))/junit-$(2).xml || rc=1; \
  exit $$rc

# the quick tier: every unit test (in parallel), every fuzz corpus, and
# the integration tests that cross each main path once (label quick)
test: build
	@$(call ctest_stage,$(BUILD),quick,-L '^quick$$')

# the code's own checks alone (HACKING.md, "Checks"; also in the quick
# tier): format, cppcheck, no circle of files (tests/lint/)
lint: build
	@$(call ctest_stage,$(BUILD),lint,-L '^lint$$')

# On a GPU host (docs/gpu.md, "One command on a GPU host"): the strict
# proof of the GPU path, every check a verdict line, a skip a failure,
# within 5 minutes (tests/gpu/prove.sh; fails, saying so, without a GPU);
# then the figures, within 5 minutes more (tests/gpu/figures.sh)
gpu-prove: build
	@bash tests/gpu/prove.sh $(BUILD)/bin

gpu-figures: build
	@bash tests/gpu/figures.sh $(BUILD)

# every test
test-all: build
	@$(call ctest_stage,$(BUILD),all,)

# the fault suite alone (tests/faults/, docs/faults.md; also in test-all)
test-faults: build
	@$(call ctest_stage,$(BUILD),faults,-L '^faults$$')

# AddressSanitizer and UBSan (SANITIZE_BUILD, LYNX_SANITIZE=ON): the unit
# tests, the fuzz corpora and the sanitize tier (the fault suite, the tests
# where the sanitizers found bugs before, those that feed daemons bad
# input); nothing that does not depend on the build (docs/testing.md)
SANITIZE_BUILD ?= build-asan
test-sanitize: deps
	@cmake -S . -B $(SANITIZE_BUILD) -DLYNX_SANITIZE=ON -DLYNX_TEST_TIME_SCALE=$(LYNX_TEST_TIME_SCALE) >/dev/null
	@cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	@$(call ctest_stage,$(SANITIZE_BUILD),sanitize,-L '^sanitize$$')

# arm64 (BlueField, docs/bluefield.md): cross-compiled into ARM64_BUILD,
# then under qemu-user the unit tests but what emulation cannot test
# (label native), and the UDP ping-pong, TCP service and coordinator
# integration tests (label emu), at time scale 5
ARM64_BUILD ?= build-arm64
test-arm64:
	@bash deploy/install-deps.sh arm64
	@cmake -S . -B $(ARM64_BUILD) -DLYNX_ARCH=arm64 -DLYNX_TEST_TIME_SCALE=$(LYNX_TEST_TIME_SCALE) >/dev/null
	@cmake --build $(ARM64_BUILD) -j $(JOBS)
	@$(call ctest_stage,$(ARM64_BUILD),arm64,-L '^emu$$')

# Debian packages of the build (deploy/packaging.cmake): lynx-coordinator,
# lynx-agent, lynx-frontend, lynxctl in $(BUILD)/packages/; for arm64:
# make deb BUILD=build-arm64 LYNX_ARCH=arm64
deb: build
	cd $(BUILD) && cpack -G DEB
	@ls -l $(BUILD)/packages/*.deb

# the quick tier with a CPU hog per core spinning beside it, at time
# scale 3 (tests/run-busy.sh; BUSY_TIER=all for every test)
BUSY_TIER ?= quick
test-busy: LYNX_TEST_TIME_SCALE = 3
test-busy: build
	@TEST_JOBS=$(TEST_JOBS) bash tests/run-busy.sh $(BUILD) $(BUSY_TIER) $(CTEST_ARGS)

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
