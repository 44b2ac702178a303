# wafer: one GNU Makefile.
#   make            build/wafer (release, -O2, runtime CPU dispatch: only *_avx2.c files get AVX2 flags)
#   make test       unit tests (cmocka), fuzz corpora replayed under ASan, end-to-end tests (pytest)
#   make asan       the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       libFuzzer targets, each fuzzed for FUZZ_SECONDS seconds
#   make check-layers  no include or call goes up a layer or sideways, no object files call each other in a circle
#   make deps       installs the Debian packages the build and tests need (apt-get; root or sudo)
#   make bench      speed benchmarks (see docs/performance.md)
#   make soak       wafer serve under a mixed and hostile load (SOAK_SECONDS, default 1800; docs/reliability.md)

CC ?= gcc
BUILD ?= build
OPT ?= -O2
CFLAGS_BASE = -std=gnu11 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -Isrc -pthread
CFLAGS += $(OPT) $(CFLAGS_BASE) $(EXTRA_CFLAGS)
SIMD_FLAGS = -mavx2 -mfma -mf16c
LDLIBS = -ljansson -lfyaml -lcurl -lsqlite3 -lhiredis -lm -lpthread
LDFLAGS += $(EXTRA_LDFLAGS)

LIB_SRC := $(filter-out src/cli/main.c,$(wildcard src/core/*.c src/engine/*.c src/engine/*/*.c src/server/*.c src/jobs/*.c src/bench/*.c src/cli/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(wildcard tests/unit/*.c))
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_SECONDS ?= 60
SHARED ?= $(abspath ../shared)
PYTHON ?= /usr/bin/python3

.PHONY: all test unit asan fuzz fuzz-build check-layers deps bench soak clean
all: $(BUILD)/wafer

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libwafer.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/wafer: $(BUILD)/obj/src/cli/main.o $(BUILD)/libwafer.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/unit/%.c $(TEST_SUPPORT) $(BUILD)/libwafer.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) $< $(TEST_SUPPORT) $(BUILD)/libwafer.a -lcmocka $(LDLIBS) -o $@

unit: $(BUILD)/wafer $(TEST_BIN)

# Fuzz targets: clang + libFuzzer + ASan/UBSan, linked against the library built once more with the same
# sanitizers (objects instrumented for coverage with fuzzer-no-link).
FUZZ_CC = clang
FUZZ_SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc -pthread $(FUZZ_SAN)
FUZZ_OBJ := $(LIB_SRC:%.c=$(BUILD)/fuzzobj/%.o)
$(BUILD)/fuzzobj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(SIMD_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/fuzzobj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(BUILD)/fuzz/libwafer-fuzz.a: $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/fuzz/%: tests/fuzz/%.c $(BUILD)/fuzz/libwafer-fuzz.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(BUILD)/fuzz/libwafer-fuzz.a $(LDLIBS) -o $@

fuzz-build: $(FUZZ_BIN)

test: unit fuzz-build
	@BUILD=$(BUILD) SHARED=$(SHARED) PYTHON=$(PYTHON) bash tests/run.sh

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" EXTRA_LDFLAGS="-fsanitize=address,undefined" unit
	@BUILD=build-asan SHARED=$(SHARED) ASAN_OPTIONS=detect_leaks=1 WAFER_TEST_UNIT_ONLY=1 bash tests/run.sh

fuzz: fuzz-build
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); mkdir -p $(BUILD)/fuzz/corpus-$$n; \
	  echo "fuzzing $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz/corpus-$$n tests/fuzz/corpus/$${n#fuzz_} || exit 1; done

deps:
	@bash scripts/install-deps.sh

# The layers core < engine < {server, jobs, route, bench} < cli, checked on the includes of src/ and on the
# symbols the built objects use (scripts/check_layers.py says the rules and prints each violation).
check-layers: $(BUILD)/wafer
	$(PYTHON) scripts/check_layers.py --obj $(BUILD)/obj

# make bench BENCH_MODELS="a.gguf b.gguf" [LLAMA_BENCH="native=/path/llama-bench ..."] [BENCH_ARGS="-r 3 --rounds 2"]
# wafer bench on each model, and llama-bench back to back when given; prints the docs/performance.md table.
BENCH_MODELS ?=
bench: $(BUILD)/wafer
	@test -n "$(BENCH_MODELS)" || { echo 'make bench: set BENCH_MODELS="model.gguf ..." (see docs/performance.md)'; exit 2; }
	$(BUILD)/wafer bench --membw
	$(PYTHON) scripts/bench_vs_llama.py --wafer $(BUILD)/wafer $(foreach l,$(LLAMA_BENCH),--llama $(l)) $(BENCH_ARGS) $(BENCH_MODELS)

# make soak [SOAK_SECONDS=1800] [SOAK_MODEL=path.gguf] [SOAK_ARGS="--sighup 20 -- --threads 2"]: a mixed load with
# hostile requests, disconnects, slow readers and SIGHUPs against a real wafer serve; fails on a lost request,
# a /health p99 above 50 ms or RSS growing by more than 10% after the warm-up (scripts/soak.py).
SOAK_SECONDS ?= 1800
SOAK_MODEL ?= $(SHARED)/models/stories260K/stories260K.gguf
SOAK_ARGS ?=
soak: $(BUILD)/wafer
	$(PYTHON) scripts/soak.py --wafer $(BUILD)/wafer --model $(SOAK_MODEL) --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj $(BUILD)/fuzzobj -name '*.d' 2>/dev/null)
