# tensorgrad: `make` builds the libraries and examples, `make test` runs the suite,
# `make sanitize` runs it under AddressSanitizer + UndefinedBehaviorSanitizer, `make tsan` the
# concurrency tests under ThreadSanitizer, `make fuzz` the fuzz harnesses in a short mode,
# `make valgrind` memcheck on the demo, `make install-test` an install into a temporary prefix
# with programs built against it; `make check` all of them. `make cross-aarch64`: a compile-only
# check of the portable path for aarch64 (needs gcc-aarch64-linux-gnu; not part of check).
# `make install` / `make uninstall` honour PREFIX (/usr/local), LIBDIR, INCLUDEDIR and DESTDIR.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
           -Iinclude -I$(BUILD)/gen -fPIC -fopenmp -fvisibility=hidden $(SAN)
# What the library itself links against; programs add their own (the digits example: zlib).
LIBS    := -lopenblas -lm -lpthread -ldl
LDLIBS  += $(LIBS) -lz

VERSION := $(shell sed -n 's/^\#define TG_VERSION_STRING "\(.*\)"/\1/p' include/tensorgrad.h)
MAJOR   := $(firstword $(subst ., ,$(VERSION)))
SONAME  := libtensorgrad.so.$(MAJOR)

SRC     := $(sort $(shell find src -name '*.c'))
HDRS    := $(shell find src -name '*.h') include/tensorgrad.h
OBJ     := $(SRC:src/%.c=$(BUILD)/obj/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
# classify.c is built against an exported model, not the library (tests/test_examples.c builds it).
EXAMPLES:= $(patsubst examples/%.c,$(BUILD)/examples/%,$(filter-out examples/classify.c,$(wildcard examples/*.c)))
# The portable C every exported model carries (src/export/portable_*.h), as string literals that
# src/export/export_text.c includes: the files compiled and tested are the ones embedded.
GEN_INC := $(BUILD)/gen/export/portable_kernels.inc $(BUILD)/gen/export/portable_loader.inc

all: $(BUILD)/libtensorgrad.a $(BUILD)/libtensorgrad.so $(EXAMPLES) $(BUILD)/bench/bench $(BUILD)/bench/gemm_bench

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -c $< -o $@

$(BUILD)/obj/export/export_text.o: $(GEN_INC)

# The CPU backend's library kernels are loops for the vectorizer, which GCC runs only from -O3.
$(BUILD)/obj/cpu/%.o: OPT := $(OPT) -O3

# Each line as a C string literal: backslashes, quotes and question marks (trigraphs) escaped.
$(BUILD)/gen/export/%.inc: src/export/%.h
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/"/' -e 's/$$/\\n"/' $< > $@

$(BUILD)/libtensorgrad.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# The shared library: libtensorgrad.so.MAJOR.MINOR.PATCH with soname libtensorgrad.so.MAJOR, and
# the two usual links beside it.
$(BUILD)/libtensorgrad.so.$(VERSION): $(OBJ)
	$(CC) -shared $(SAN) -Wl,-soname,$(SONAME) -fopenmp -o $@ $^ $(LIBS)

$(BUILD)/libtensorgrad.so: $(BUILD)/libtensorgrad.so.$(VERSION)
	ln -sf libtensorgrad.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libtensorgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc $< -o $@ $(BUILD)/libtensorgrad.a $(LDLIBS)

# gemm_bench calls the CPU product kernel directly, through the library's internal header.
$(BUILD)/bench/gemm_bench: bench/gemm_bench.c $(HDRS) $(BUILD)/libtensorgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc $< -o $@ $(BUILD)/libtensorgrad.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libtensorgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libtensorgrad.a $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(wildcard examples/*.h) $(BUILD)/libtensorgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libtensorgrad.a $(LDLIBS)

# Every test binary, then one summary line "N passed, N failed".
test: $(TESTS) $(EXAMPLES)
	@sh tests/run.sh $(TESTS)

# The whole suite: plain, then under AddressSanitizer + UndefinedBehaviorSanitizer, the
# concurrency tests under ThreadSanitizer, the fuzz harnesses in their short mode, and valgrind
# on the demo.
check: test
	$(MAKE) install-test
	$(MAKE) sanitize
	$(MAKE) tsan
	$(MAKE) fuzz
	$(MAKE) valgrind

# valgrind memcheck on the digits demo for one epoch: no leak (definite or possible) and no
# invalid access, else a non-zero exit. valgrind cannot run AVX-512 and hides it from CPUID, so
# the library and the generated kernels take the AVX2 path by themselves (cpu_isa.c);
# tests/valgrind.supp explains its one suppression (libgomp's thread pool).
VALGRIND := valgrind --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=1 \
            --suppressions=tests/valgrind.supp
valgrind: $(BUILD)/examples/digits
	TG_CFLAGS=-O2 OMP_WAIT_POLICY=passive $(VALGRIND) $(BUILD)/examples/digits --epochs 1

# Compile-only check of the portable path for aarch64 (Debian's gcc-aarch64-linux-gnu; OpenBLAS's
# cblas.h from the host, its interface being the same): every library source with the warnings
# as errors, then the code the CPU backend generates for the bench workloads on the portable path.
CROSS_CC  ?= aarch64-linux-gnu-gcc
CROSS_DIR := $(BUILD)/cross-aarch64
cross-aarch64: $(BUILD)/bench/bench $(GEN_INC)
	rm -rf $(CROSS_DIR) && mkdir -p $(CROSS_DIR)
	for f in $(SRC); do $(CROSS_CC) $(CFLAGS) -Isrc -I/usr/include/$$($(CC) -dumpmachine)/openblas-pthread \
	    -c $$f -o $(CROSS_DIR)/$$(echo $$f | tr / _).o || exit 1; done
	TG_CPU_ISA=portable $(BUILD)/bench/bench --steps-scale 0.05 --kernels $(CROSS_DIR) sin_mlp mnist_mlp cifar_cnn char_gpt_small > /dev/null
	for w in sin_mlp mnist_mlp cifar_cnn char_gpt_small; do \
	    $(CROSS_CC) -x c -O3 -fopenmp -fPIC -fno-strict-aliasing -fno-math-errno -fwrapv -c $(CROSS_DIR)/$$w.cpu.txt -o $(CROSS_DIR)/$$w.o || exit 1; done
	@echo "cross-aarch64: $(words $(SRC)) library sources and 4 generated kernel files compile for aarch64"

SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 SAN="$(SANFLAGS)" test

# Fuzzing, short mode (gcc, no clang needed): each harness replays its seed corpus
# (tests/fixtures/NAME/) and then runs random mutations for FUZZ_SECONDS, under ASan + UBSan,
# through the small driver tests/fuzz_main.c.
FUZZERS      := fuzz_graph fuzz_safetensors
FUZZ_SECONDS ?= 25
fuzz:
	$(MAKE) BUILD=build-san OPT=-O1 SAN="$(SANFLAGS)" fuzz-short

fuzz-short: $(FUZZERS:%=$(BUILD)/fuzz/%)
	@for f in $(FUZZERS); do (cd $(BUILD)/fuzz && ./$$f $(FUZZ_SECONDS) $(CURDIR)/tests/fixtures/$$f) || exit 1; done

$(BUILD)/fuzz/%: tests/%.c tests/fuzz_main.c $(BUILD)/libtensorgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc $< tests/fuzz_main.c -o $@ $(BUILD)/libtensorgrad.a $(LDLIBS)

# Fuzzing with libFuzzer (clang): coverage-guided, FUZZ_TIME seconds per harness; new inputs go
# to build-fuzz/corpus-NAME, the committed seeds stay as they are.
FUZZ_CC   ?= clang
FUZZ_TIME ?= 300
fuzz-clang: $(FUZZERS:%=build-fuzz/%)
	@for f in $(FUZZERS); do mkdir -p build-fuzz/corpus-$$f; \
	  build-fuzz/$$f build-fuzz/corpus-$$f tests/fixtures/$$f -max_len=4096 -max_total_time=$(FUZZ_TIME) \
	    -print_final_stats=1 $$( [ -f tests/fixtures/$$f.dict ] && echo -dict=tests/fixtures/$$f.dict ) || exit 1; done

build-fuzz/%: tests/%.c $(SRC) $(HDRS) $(GEN_INC)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  -Iinclude -Isrc -I$(BUILD)/gen $< $(SRC) -o $@ $(LDLIBS)

# The concurrency tests under ThreadSanitizer, on the reference interpreter (TSan does not see
# OpenMP's synchronization inside the compiled CPU kernels).
tsan:
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" build-tsan/tests/test_session
	TG_SESSION_BACKENDS=reference TSAN_OPTIONS="halt_on_error=1" sh tests/run.sh build-tsan/tests/test_session

# Installing: the header, both libraries, a pkg-config file and a CMake package
# (find_package(tensorgrad) gives tensorgrad::tensorgrad, and tensorgrad::tensorgrad_static).
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PCDIR      := $(LIBDIR)/pkgconfig
CMAKEDIR   := $(LIBDIR)/cmake/tensorgrad
SUBST      := sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
                  -e 's|@VERSION@|$(VERSION)|g' -e 's|@MAJOR@|$(MAJOR)|g' -e 's|@LIBS@|$(LIBS)|g'

install: $(BUILD)/libtensorgrad.a $(BUILD)/libtensorgrad.so
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PCDIR) $(DESTDIR)$(CMAKEDIR)
	install -m 644 include/tensorgrad.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(BUILD)/libtensorgrad.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(BUILD)/libtensorgrad.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libtensorgrad.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libtensorgrad.so
	$(SUBST) packaging/tensorgrad.pc.in > $(DESTDIR)$(PCDIR)/tensorgrad.pc
	$(SUBST) packaging/tensorgrad-config.cmake.in > $(DESTDIR)$(CMAKEDIR)/tensorgrad-config.cmake
	$(SUBST) packaging/tensorgrad-config-version.cmake.in > $(DESTDIR)$(CMAKEDIR)/tensorgrad-config-version.cmake

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/tensorgrad.h $(DESTDIR)$(LIBDIR)/libtensorgrad.a \
	      $(DESTDIR)$(LIBDIR)/libtensorgrad.so $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libtensorgrad.so.$(VERSION) \
	      $(DESTDIR)$(PCDIR)/tensorgrad.pc $(DESTDIR)$(CMAKEDIR)/tensorgrad-config.cmake \
	      $(DESTDIR)$(CMAKEDIR)/tensorgrad-config-version.cmake
	-rmdir $(DESTDIR)$(CMAKEDIR) 2>/dev/null

# Installs into a temporary prefix, builds examples/sin.c out of the tree against it (pkg-config,
# static and shared; CMake where installed), runs each, checks the exported symbols and the
# version, and uninstalls.
install-test: $(BUILD)/libtensorgrad.a $(BUILD)/libtensorgrad.so
	sh tests/install_test.sh $(BUILD)

demo: $(BUILD)/examples/digits
	$(BUILD)/examples/digits

clean:
	rm -rf build build-san build-tsan build-fuzz

.PHONY: all test check sanitize tsan fuzz fuzz-short fuzz-clang valgrind install uninstall install-test demo clean cross-aarch64
.SECONDARY:
