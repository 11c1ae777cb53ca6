#!/bin/sh
# `make install-test`: installs into a temporary prefix (through DESTDIR, as a packager would),
# then builds examples/sin.c out of the tree the ways a user would (pkg-config with the shared
# library, pkg-config --static, and CMake's find_package where cmake is installed), runs each
# for a few steps, checks that the shared library exports only tg_ symbols and that its soname,
# tg_version() and the header's macros agree, and uninstalls. Prints "install_test: N passed,
# N failed" like the other tests.
#   tests/install_test.sh [BUILD]
set -u
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=/opt/tensorgrad-test          # the prefix the files are configured for ...
dest="$tmp/dest"                     # ... staged under DESTDIR
lib="$dest$prefix/lib"
passed=0; failed=0
ok()   { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "install_test: FAIL: $*"; }
check() { if eval "$2" >"$tmp/out" 2>&1; then ok; else fail "$1"; tail -n 20 "$tmp/out"; fi; }

check "make install" "make -C '$root' --no-print-directory BUILD='$build' PREFIX=$prefix DESTDIR='$dest' install"
for f in include/tensorgrad.h lib/libtensorgrad.a lib/libtensorgrad.so lib/pkgconfig/tensorgrad.pc \
         lib/cmake/tensorgrad/tensorgrad-config.cmake lib/cmake/tensorgrad/tensorgrad-config-version.cmake; do
    [ -e "$dest$prefix/$f" ] && ok || fail "$f not installed"
done

# The version: header macros, the real file's name, the soname, tg_version().
version=$(sed -n 's/^#define TG_VERSION_STRING "\(.*\)"/\1/p' "$dest$prefix/include/tensorgrad.h")
major=${version%%.*}
[ -f "$lib/libtensorgrad.so.$version" ] && ok || fail "no libtensorgrad.so.$version"
[ "$(readlink "$lib/libtensorgrad.so")" = "libtensorgrad.so.$major" ] && ok || fail "libtensorgrad.so does not point at the soname"
soname=$(objdump -p "$lib/libtensorgrad.so.$version" | awk '/SONAME/ { print $2 }')
[ "$soname" = "libtensorgrad.so.$major" ] && ok || fail "soname is '$soname', expected libtensorgrad.so.$major"

# Only tg_ symbols leave the shared library.
others=$(nm -D --defined-only "$lib/libtensorgrad.so.$version" | awk '{ print $3 }' | grep -v '^tg_')
[ -z "$others" ] && ok || fail "the shared library exports non-tg_ symbols: $(echo $others | head -c 300)"
count=$(nm -D --defined-only "$lib/libtensorgrad.so.$version" | grep -c ' tg_')
[ "$count" -gt 100 ] && ok || fail "only $count tg_ symbols exported"

# The pkg-config file, rewritten to the staging directory the way a packager's sysroot does.
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest"
[ "$(pkg-config --modversion tensorgrad)" = "$version" ] && ok || fail "pkg-config --modversion is not $version"

cat > "$tmp/version.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <tensorgrad.h>
int main(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", TG_VERSION_MAJOR, TG_VERSION_MINOR, TG_VERSION_PATCH);
    printf("%s %s\n", tg_version(), want);
    return strcmp(tg_version(), want) != 0 || strcmp(TG_VERSION_STRING, want) != 0;
}
EOF
check "version program (pkg-config, shared)" \
    "cc '$tmp/version.c' \$(pkg-config --cflags --libs tensorgrad) -o '$tmp/version' && LD_LIBRARY_PATH='$lib' '$tmp/version'"

# examples/sin.c against the installed library, shared and static, a few steps each.
check "sin.c with pkg-config (shared)" \
    "cc -O2 '$root/examples/sin.c' -I'$root/examples' \$(pkg-config --cflags --libs tensorgrad) -lm -o '$tmp/sin_shared'"
check "sin (shared) runs" "LD_LIBRARY_PATH='$lib' '$tmp/sin_shared' --steps 50 --backend reference"
ldd "$tmp/sin_shared" 2>/dev/null | grep -q 'libtensorgrad.so' && ok || fail "sin_shared is not linked to the shared library"
check "sin.c with pkg-config --static" \
    "cc -O2 '$root/examples/sin.c' -I'$root/examples' \$(pkg-config --cflags tensorgrad) -o '$tmp/sin_static' \
       '$lib/libtensorgrad.a' \$(pkg-config --libs-only-other --libs-only-l --static tensorgrad | sed 's/-ltensorgrad//')"
check "sin (static) runs on the compiled CPU backend" "'$tmp/sin_static' --steps 50 --backend cpu"

# CMake: find_package(tensorgrad) and the tensorgrad::tensorgrad target.
if command -v cmake >/dev/null 2>&1; then
    mkdir -p "$tmp/cmake"
    cat > "$tmp/cmake/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.13)
project(sin_app C)
find_package(tensorgrad $major REQUIRED)
add_executable(sin "$root/examples/sin.c")
target_include_directories(sin PRIVATE "$root/examples")
target_link_libraries(sin PRIVATE tensorgrad::tensorgrad m)
add_executable(sin_static "$root/examples/sin.c")
target_include_directories(sin_static PRIVATE "$root/examples")
target_link_libraries(sin_static PRIVATE tensorgrad::tensorgrad_static m)
EOF
    # The package names its final paths; staged files are reached by rewriting the prefix.
    sed -i "s|$prefix|$dest$prefix|g" "$lib/cmake/tensorgrad/tensorgrad-config.cmake"
    check "cmake configure" "cmake -S '$tmp/cmake' -B '$tmp/cmake/build' -DCMAKE_PREFIX_PATH='$dest$prefix'"
    check "cmake build" "cmake --build '$tmp/cmake/build'"
    check "sin (CMake, shared) runs" "LD_LIBRARY_PATH='$lib' '$tmp/cmake/build/sin' --steps 50 --backend reference"
    check "sin (CMake, static) runs" "'$tmp/cmake/build/sin_static' --steps 50 --backend reference"
else
    echo "install_test: cmake is not installed: the CMake package is not checked"
fi

check "make uninstall" "make -C '$root' --no-print-directory BUILD='$build' PREFIX=$prefix DESTDIR='$dest' uninstall"
left=$(find "$dest" -type f | head -5)
[ -z "$left" ] && ok || fail "files left after uninstall: $left"

echo "install_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
