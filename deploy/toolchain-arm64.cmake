# deploy/toolchain-arm64.cmake - cross-compiles Lynx-C for arm64 (aarch64:
# BlueField's Arm cores) with Debian's cross toolchain against the arm64
# development packages installed beside the host's with multiarch
# (deploy/install-deps.sh --arm64). `make BUILD=build-arm64 LYNX_ARCH=arm64`
# selects it; docs/bluefield.md.
#
# Headers of multiarch packages are shared (/usr/include) or under
# /usr/include/aarch64-linux-gnu, libraries under /usr/lib/aarch64-linux-gnu:
# the cross compiler searches both by itself, and pkg-config is pointed at
# the arm64 .pc files only. Programs the build runs (protoc-c) are the
# host's. Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR) with
# the arm64 C library of multiarch (libc6:arm64: /lib/ld-linux-aarch64.so.1
# and /lib/aarch64-linux-gnu), which the arm64 development packages pull
# in. Not with -L /usr/aarch64-linux-gnu: that C library is the cross
# toolchain's own, older build, and a program linked against the
# multiarch libraries hangs in its first pthread_create with it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
find_program(LYNX_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(LYNX_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${LYNX_QEMU_AARCH64}")
endif()
