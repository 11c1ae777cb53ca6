# tensorgrad: `make` builds the libraries and examples, `make test` runs the suite,
# `make sanitize` runs it under AddressSanitizer + UndefinedBehaviorSanitizer, `make tsan` the
# concurrency tests under ThreadSanitizer, `make check` all three.
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

# The whole suite: plain, then under AddressSanitizer + UndefinedBehaviorSanitizer.
check: test
	$(MAKE) sanitize
	$(MAKE) tsan

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" test

# The concurrency tests under ThreadSanitizer, on the reference interpreter (TSan does not see
# OpenMP's synchronization inside the compiled CPU kernels).
tsan:
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" build-tsan/tests/test_session
	TG_SESSION_BACKENDS=reference TSAN_OPTIONS="halt_on_error=1" sh tests/run.sh build-tsan/tests/test_session

demo: $(BUILD)/examples/digits
	$(BUILD)/examples/digits

clean:
	rm -rf build build-san build-tsan

.PHONY: all test check sanitize tsan demo clean
.SECONDARY:
