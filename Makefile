# wafer: one GNU Makefile.
#   make            build/wafer (release, -O2, runtime CPU dispatch: only *_avx2.c files get AVX2 flags)
#   make test       unit tests (cmocka), fuzz corpora replayed under ASan, end-to-end tests (pytest), then a
#                   2-minute soak on stories260K (TEST_SOAK_SECONDS=120; 0 skips it)
#   make asan       the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       libFuzzer targets, each fuzzed for FUZZ_SECONDS seconds
#   make check-layers  no include or call goes up a layer or sideways, no object files call each other in a circle
#   make deps       installs the Debian packages the build and tests need (apt-get; root or sudo)
#   make bench      speed benchmarks (see docs/performance.md)
#   make bench-slo  goodput of max_batch_size: auto against fixed 32 and fixed 4 (docs/observability.md)
#   make bench-route  the latency wafer route adds, against nginx proxy_pass (docs/route.md)
#   make examples   the C client library's example programs (build/examples/)
#   make install    PREFIX=/usr/local DESTDIR=: binary, client library and header, man pages, systemd unit
#   make soak       wafer serve under a mixed and hostile load (SOAK_SECONDS, default 1800; docs/reliability.md)

CC ?= gcc
BUILD ?= build
OPT ?= -O2
CFLAGS_BASE = -std=gnu11 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -Isrc -Iinclude -pthread
CFLAGS += $(OPT) $(CFLAGS_BASE) $(EXTRA_CFLAGS)
SIMD_FLAGS = -mavx2 -mfma -mf16c
LDLIBS = -ljansson -lfyaml -lcurl -lsqlite3 -lhiredis -lm -lpthread
LDFLAGS += $(EXTRA_LDFLAGS)

LIB_SRC := $(filter-out src/cli/main.c,$(wildcard src/core/*.c src/engine/*.c src/engine/*/*.c src/server/*.c src/jobs/*.c src/route/*.c src/bench/*.c src/pull/*.c src/client/*.c src/cli/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# The C client library (include/wafer/client.h) on its own, for programs that talk to a server: static, and
# shared from position-independent objects.
CLIENT_SRC := $(wildcard src/client/*.c)
CLIENT_LIBS = -lcurl -ljansson -lpthread
CLIENT_SONAME = libwafer-client.so.0
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
# wafer --version: VERSION and the commit (git describe, when this is a git checkout; else "unknown";
# `make GIT_COMMIT=...` overrides, as the Dockerfile does).
VERSION = 0.1.0
ifeq ($(origin GIT_COMMIT),undefined)
GIT_COMMIT := $(shell test -e .git && git describe --always --dirty 2>/dev/null || echo unknown)
endif
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(wildcard tests/unit/*.c))
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_SECONDS ?= 60
SHARED ?= $(abspath ../shared)
PYTHON ?= /usr/bin/python3

.PHONY: all test unit asan fuzz fuzz-build check-layers deps bench bench-vs-llama bench-route bench-slo bench-jobs soak clean examples man install FORCE
all: $(BUILD)/wafer $(BUILD)/libwafer-client.a $(BUILD)/libwafer-client.so

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

# rewritten only when the version or commit changes, so main.o is rebuilt only then
$(BUILD)/gen/version.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define WAFER_VERSION "%s"\n#define WAFER_COMMIT "%s"\n' '$(VERSION)' '$(GIT_COMMIT)' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/obj/src/cli/main.o: $(BUILD)/gen/version.h
$(BUILD)/obj/src/cli/main.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@

$(BUILD)/libwafer-client.a: $(CLIENT_SRC:%.c=$(BUILD)/obj/%.o)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libwafer-client.so: $(CLIENT_SRC:%.c=$(BUILD)/pic/%.o)
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(CLIENT_SONAME) $^ $(CLIENT_LIBS) -o $@

examples: $(EXAMPLE_BIN)
$(BUILD)/examples/%: examples/%.c include/wafer/client.h $(BUILD)/libwafer-client.a
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -std=c11 -g -Wall -Wextra -Werror -Iinclude $(LDFLAGS) $< $(BUILD)/libwafer-client.a $(CLIENT_LIBS) -o $@

# man pages generated from each command's --help
man: $(BUILD)/wafer
	@rm -rf $(BUILD)/man
	sh scripts/gen-man.sh $(BUILD)/wafer $(BUILD)/man

install: all man
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/wafer \
	  $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(SYSTEMDUNITDIR)
	install -m 755 $(BUILD)/wafer $(DESTDIR)$(BINDIR)/wafer
	install -m 644 include/wafer/client.h $(DESTDIR)$(INCLUDEDIR)/wafer/client.h
	install -m 644 $(BUILD)/libwafer-client.a $(DESTDIR)$(LIBDIR)/libwafer-client.a
	install -m 755 $(BUILD)/libwafer-client.so $(DESTDIR)$(LIBDIR)/$(CLIENT_SONAME)
	ln -sf $(CLIENT_SONAME) $(DESTDIR)$(LIBDIR)/libwafer-client.so
	install -m 644 $(BUILD)/man/*.1 $(DESTDIR)$(MANDIR)/man1/
	sed 's|/usr/local/bin/wafer|$(BINDIR)/wafer|g' packaging/wafer.service >$(DESTDIR)$(SYSTEMDUNITDIR)/wafer.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/wafer.service
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|; s|@VERSION@|$(VERSION)|' \
	  packaging/wafer-client.pc.in >$(DESTDIR)$(LIBDIR)/pkgconfig/wafer-client.pc

$(BUILD)/tests/%: tests/unit/%.c $(TEST_SUPPORT) $(BUILD)/libwafer.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) $< $(TEST_SUPPORT) $(BUILD)/libwafer.a -lcmocka $(LDLIBS) -o $@

unit: $(BUILD)/wafer $(TEST_BIN)

# Fuzz targets: clang + libFuzzer + ASan/UBSan, linked against the library built once more with the same
# sanitizers (objects instrumented for coverage with fuzzer-no-link).
FUZZ_CC = clang
FUZZ_SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc -Iinclude -pthread $(FUZZ_SAN)
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

TEST_SOAK_SECONDS ?= 120
test: unit fuzz-build examples
	@BUILD=$(BUILD) SHARED=$(SHARED) PYTHON=$(PYTHON) TEST_SOAK_SECONDS=$(TEST_SOAK_SECONDS) bash tests/run.sh

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
# The objects are a prerequisite, built by this make with whatever -j it was given (`make -j2 check-layers`,
# as .ci/run does): a sub-make forcing its own -j reset the caller's jobserver, and under some callers failed
# with "wait: No child processes".
check-layers: $(BUILD)/wafer
	$(PYTHON) scripts/check_layers.py --obj $(BUILD)/obj

# make bench BENCH_MODELS="a.gguf b.gguf" [LLAMA_BENCH="native=/path/llama-bench ..."] [BENCH_ARGS="-r 3 --rounds 2"]
# wafer bench on each model, and llama-bench back to back when given; prints the docs/performance.md table.
BENCH_MODELS ?=
# make bench-slo [SLO_MODEL=model.gguf] [SLO_ARGS="--rounds 3 --itl 40 --ttft 3000"]
# goodput of max_batch_size: auto against fixed 32 and fixed 4 (docs/observability.md).
SLO_MODEL ?= $(SHARED)/models/llama-19M/llama-19M-Q8_0.gguf
bench-slo: $(BUILD)/wafer
	WAFER_BIN=$(BUILD)/wafer $(PYTHON) scripts/bench_slo.py $(SLO_MODEL) $(SLO_ARGS)

bench: $(BUILD)/wafer
	@test -n "$(BENCH_MODELS)" || { echo 'make bench: set BENCH_MODELS="model.gguf ..." (see docs/performance.md)'; exit 2; }
	$(BUILD)/wafer bench --membw
	$(PYTHON) scripts/bench_vs_llama.py --wafer $(BUILD)/wafer $(foreach l,$(LLAMA_BENCH),--llama $(l)) $(BENCH_ARGS) $(BENCH_MODELS)

# make bench-vs-llama LLAMA_BIN=/path/llama-bench BENCH_MODELS="a.gguf b.gguf" [BENCH_ARGS="-r 3 --rounds 5 -d 4096"]
# wafer bench and llama-bench interleaved on the same files (round by round), medians of the per-round ratios.
LLAMA_BIN ?=
bench-vs-llama: $(BUILD)/wafer
	@test -n "$(LLAMA_BIN)" || { echo 'make bench-vs-llama: set LLAMA_BIN=/path/to/llama-bench (docs/performance.md says how to build it)'; exit 2; }
	@test -n "$(BENCH_MODELS)" || { echo 'make bench-vs-llama: set BENCH_MODELS="model.gguf ..."'; exit 2; }
	$(PYTHON) scripts/bench_vs_llama.py --wafer $(BUILD)/wafer --llama native=$(LLAMA_BIN) $(BENCH_ARGS) $(BENCH_MODELS)

# make bench-route [BENCH_ROUTE_ARGS="--rate 1000 --seconds 5 --rounds 3 --idle 10000"]: wafer route and nginx
# proxy_pass in front of the same nginx backend, open-loop load from scripts/route_loadgen.c (docs/route.md).
BENCH_ROUTE_ARGS ?=
bench-route: $(BUILD)/wafer $(BUILD)/bench/route_loadgen
	$(PYTHON) scripts/bench_route.py --wafer $(BUILD)/wafer --loadgen $(BUILD)/bench/route_loadgen $(BENCH_ROUTE_ARGS)
$(BUILD)/bench/route_loadgen: scripts/route_loadgen.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=gnu11 -Wall -Wextra -Werror $< -o $@

# make bench-jobs [BENCH_JOBS_MODEL=path.gguf] [BENCH_JOBS_ARGS="--rounds 5"]: live TTFT p95 with and without a batch
# running, and batch throughput vs wafer bench serve at full concurrency (scripts/bench_jobs.py, docs/jobs.md).
BENCH_JOBS_MODEL ?= $(SHARED)/models/llama-19M/llama-19M-Q8_0.gguf
BENCH_JOBS_ARGS ?=
bench-jobs: $(BUILD)/wafer
	WAFER_BIN=$(abspath $(BUILD)/wafer) $(PYTHON) scripts/bench_jobs.py $(BENCH_JOBS_MODEL) $(BENCH_JOBS_ARGS)

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

-include $(shell find $(BUILD)/obj $(BUILD)/pic $(BUILD)/fuzzobj -name '*.d' 2>/dev/null)
