# tensorgrad: `make` builds the libraries and examples, `make test` runs the suite,
# `make sanitize` runs it under AddressSanitizer + UndefinedBehaviorSanitizer, `make tsan` the
# concurrency tests under ThreadSanitizer, `make fuzz` the fuzz harnesses in a short mode,
# `make valgrind` memcheck on the demo; `make check` all five.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
           -Iinclude -fPIC -fopenmp $(SAN)
LDLIBS  += -lopenblas -lm -lz -lpthread -ldl

SRC     := $(wildcard src/*.c)
OBJ     := $(SRC:src/%.c=$(BUILD)/obj/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
EXAMPLES:= $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))

all: $(BUILD)/libtensorgrad.a $(BUILD)/libtensorgrad.so $(EXAMPLES) $(BUILD)/bench/bench

$(BUILD)/obj/%.o: src/%.c $(wildcard src/*.h) include/tensorgrad.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtensorgrad.a: $(OBJ)
	ar rcs $@ $^

$(BUILD)/libtensorgrad.so: $(OBJ)
	$(CC) -shared $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libtensorgrad.a
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
	$(MAKE) sanitize
	$(MAKE) tsan
	$(MAKE) fuzz
	$(MAKE) valgrind

# valgrind memcheck on the digits demo for one epoch: no leak (definite or possible) and no
# invalid access, else a non-zero exit. Kernels are built without -march=native, since valgrind
# cannot run AVX-512; tests/valgrind.supp explains its one suppression (libgomp's thread pool).
VALGRIND := valgrind --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=1 \
            --suppressions=tests/valgrind.supp
valgrind: $(BUILD)/examples/digits
	TG_CFLAGS=-O2 OMP_WAIT_POLICY=passive $(VALGRIND) $(BUILD)/examples/digits --epochs 1

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

build-fuzz/%: tests/%.c $(SRC) $(wildcard src/*.h) include/tensorgrad.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  -Iinclude -Isrc $< $(SRC) -o $@ $(LDLIBS)

# The concurrency tests under ThreadSanitizer, on the reference interpreter (TSan does not see
# OpenMP's synchronization inside the compiled CPU kernels).
tsan:
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" build-tsan/tests/test_session
	TG_SESSION_BACKENDS=reference TSAN_OPTIONS="halt_on_error=1" sh tests/run.sh build-tsan/tests/test_session

demo: $(BUILD)/examples/digits
	$(BUILD)/examples/digits

clean:
	rm -rf build build-san build-tsan build-fuzz

.PHONY: all test check sanitize tsan fuzz fuzz-short fuzz-clang valgrind demo clean
.SECONDARY:
