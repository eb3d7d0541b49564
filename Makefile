# shunt: one entry point for deps, build, tests, benchmarks, demo and install.
# Sources are found by wildcard, so a new file in a part needs no edit here.
# Parts that need their own rules (guest kernel, fabric, bench scenarios)
# live in mk/*.mk fragments; `deps::` and `test-extra::` are double-colon so
# each fragment can add to them.

PREFIX   ?= /usr/local
BUILD    ?= build
CXX      ?= g++
CC       ?= gcc
SAN      ?=
OPT      ?= -O2
# Line tables only: backtraces and perf keep file:line, and a full build takes
# about a quarter less time than with -g (make DBG=-g for gdb's variables)
DBG      ?= -g1
JOBS     ?= $(shell nproc)

# Debian packages the build, tests and benchmarks need; fragments add more.
DEB_PACKAGES := build-essential g++ make pkg-config python3 binutils \
  libibverbs-dev rdma-core ibverbs-utils ibverbs-providers \
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev \
  libgtest-dev libbenchmark-dev libsodium-dev librdmacm-dev mandoc

WARN     := -Wall -Wextra -Werror -Wno-missing-field-initializers
DEFS     := -D_GNU_SOURCE -DSPDLOG_HEADER_ONLY -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY \
            -DSHUNT_VERSION=\"$(shell cat VERSION)\"
CXXFLAGS_BASE := -std=c++20 $(OPT) $(DBG) -fPIC -fvisibility=hidden -fvisibility-inlines-hidden \
            $(WARN) $(DEFS) -I. $(SAN)
CFLAGS_BASE   := -std=gnu11 $(OPT) $(DBG) $(WARN) -D_GNU_SOURCE $(SAN)

# Library: every .cc under the library's parts. exports.cc and *_exports.cc files define the
# interposed entry points and go only into the .so; everything else also goes
# into a static archive that the unit tests and tools link.
LIB_DIRS    := core peer clocksync telemetry interpose interpose/verbs interpose/verbs/bundle interpose/socket agent
LIB_SRCS    := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.cc))
CORE_SRCS   := $(filter-out %/exports.cc %_exports.cc,$(LIB_SRCS))
LIB_OBJS    := $(patsubst %.cc,$(BUILD)/obj/%.o,$(LIB_SRCS))
CORE_OBJS   := $(patsubst %.cc,$(BUILD)/obj/%.o,$(CORE_SRCS))
LIB_LIBS    := -libverbs -ldl -lpthread

SHUNT_SO    := $(BUILD)/lib/libshunt.so
RDMACM_SHIM := $(BUILD)/lib/libshunt-rdmacm.so
CORE_A      := $(BUILD)/lib/libshunt_core.a
# The bundle's test hooks: linked into the unit tests and the
# microbenchmark, never into libshunt.so.
TESTHOOK_OBJS := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard interpose/verbs/bundle/testing/*.cc))
VERSION_MAP := $(BUILD)/shunt.map

# Tools: each tools/<name>/ with .cc files becomes build/bin/<name>; a
# tools/<name> that is a plain file (a script) is copied there.
TOOL_DIRS   := $(patsubst tools/%/,%,$(dir $(wildcard tools/*/*.cc)))
TOOL_BINS   := $(addprefix $(BUILD)/bin/,$(sort $(TOOL_DIRS)))
TOOL_SCRIPTS:= $(addprefix $(BUILD)/bin/,$(notdir $(shell find tools -maxdepth 1 -type f -perm -u+x)))
# shunt-fabric's package (tools/shunt_fabric/) is copied beside it, to
# build/bin/shunt_fabric/; installed, it is in PREFIX/share/shunt/tools/.
FABRIC_PY   := $(patsubst tools/%,$(BUILD)/bin/%,$(wildcard tools/shunt_fabric/*.py))
TOOL_LIBS_shuntctl :=

# Examples: each examples/*.c is a program; examples/*_lib.c a shared object.
EX_SRCS     := $(filter-out %_lib.c,$(wildcard examples/*.c))
EX_BINS     := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EX_SRCS))
EX_LIBS     := $(patsubst examples/%.c,$(BUILD)/examples/%.so,$(wildcard examples/*_lib.c))

# Test helper programs: test/e2e/*.c (built next to the scripts' build dir).
TPROG_SRCS  := $(filter-out %_lib.c,$(wildcard test/e2e/*.c))
TPROG_BINS  := $(patsubst test/e2e/%.c,$(BUILD)/test/%,$(TPROG_SRCS))
TPROG_LIBS  := $(patsubst test/e2e/%.c,$(BUILD)/test/%.so,$(wildcard test/e2e/*_lib.c))

UNIT_SRCS   := $(wildcard test/unit/*.cc)
UNIT_BIN    := $(BUILD)/test/unit_tests

MICRO_SRCS  := $(wildcard bench/micro/*.cc)
MICRO_BIN   := $(BUILD)/bench/micro

# Manual pages: man/*.N are installed as they are; man/*.N.in get their
# variable list from the registry (shuntctl config --man), so it cannot drift.
MAN_STATIC  := $(wildcard man/*.[1-9])
MAN_GEN     := $(patsubst man/%.in,$(BUILD)/man/%,$(wildcard man/*.in))

.PHONY: demo config-table all deps apt-deps test test-unit test-e2e test-extra bench bench-extra soak demo install clean asan tsan format lint
all: $(SHUNT_SO) $(RDMACM_SHIM) $(TOOL_BINS) $(TOOL_SCRIPTS) $(FABRIC_PY) $(EX_BINS) $(EX_LIBS) $(MAN_GEN)

-include mk/*.mk

# ---------------------------------------------------------------- deps
deps:: apt-deps
apt-deps:
	@mk/install-deps $(sort $(DEB_PACKAGES))

# ---------------------------------------------------------------- library
$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_BASE) -MMD -MP -c $< -o $@

$(VERSION_MAP): interpose/gen-version-map interpose/exports.list
	@mkdir -p $(dir $@)
	interpose/gen-version-map interpose/exports.list > $@.tmp && mv $@.tmp $@

$(SHUNT_SO): $(LIB_OBJS) $(VERSION_MAP)
	@mkdir -p $(dir $@)
	$(CXX) -shared $(SAN) -o $@ $(LIB_OBJS) -Wl,--version-script=$(VERSION_MAP) -Wl,-soname,libshunt.so \
	  -Wl,-z,defs -Wl,-z,now -Wl,--no-undefined $(LIB_LIBS)

# What a dlopen of librdmacm gets under libshunt: an empty object that needs
# libshunt (matched by its soname to the one loaded) before librdmacm.
$(RDMACM_SHIM): interpose/shim/rdmacm.c $(SHUNT_SO)
	$(CC) $(CFLAGS_BASE) -fPIC -shared -o $@ $< -Wl,--no-as-needed -L$(BUILD)/lib -l:libshunt.so -lrdmacm \
	  -Wl,-rpath,'$$ORIGIN'

$(CORE_A): $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# ---------------------------------------------------------------- tools
# A tool's objects are made through the pattern rule below alone, so make
# took them for intermediate files and deleted them after a clean build;
# the next make that read their dependency files (make install, under e2e
# 23) then had to build every tool again.
TOOL_OBJS := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard tools/*/*.cc))
.SECONDARY: $(TOOL_OBJS)
.SECONDEXPANSION:
$(BUILD)/bin/%: $$(subst .cc,.o,$$(addprefix $(BUILD)/obj/,$$(wildcard tools/$$*/*.cc))) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -o $@ $(filter %.o,$^) -Wl,--whole-archive $(CORE_A) -Wl,--no-whole-archive \
	  $(TOOL_LIBS_$*) $(LIB_LIBS)

# Scripts get the version written in (their --version).
$(TOOL_SCRIPTS): $(BUILD)/bin/%: tools/% VERSION
	@mkdir -p $(dir $@)
	sed 's/@SHUNT_VERSION@/$(shell cat VERSION)/g' $< > $@.tmp && chmod 0755 $@.tmp && mv $@.tmp $@

$(FABRIC_PY): $(BUILD)/bin/%: tools/%
	@mkdir -p $(dir $@)
	install -m 0644 $< $@

$(BUILD)/man/%: man/%.in $(BUILD)/bin/shuntctl
	@mkdir -p $(dir $@)
	$(BUILD)/bin/shuntctl config --man > $@.env
	sed -e '/@ENVIRONMENT@/{r $@.env' -e 'd}' $< > $@ && rm -f $@.env

# ---------------------------------------------------------------- examples
$(BUILD)/examples/%: examples/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -o $@ $< -libverbs -ldl -lpthread

$(BUILD)/examples/%.so: examples/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -fPIC -shared -o $@ $<

$(BUILD)/test/%: test/e2e/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -o $@ $< -libverbs -ldl -lpthread -L$(BUILD)/test -Wl,-rpath,'$$ORIGIN' \
	  $(if $(wildcard test/e2e/$*_lib.c),-l:$*_lib.so,)

$(BUILD)/test/%.so: test/e2e/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -fPIC -shared -o $@ $<

# test programs that link a *_lib.so need it first
$(foreach l,$(TPROG_LIBS),$(eval $(patsubst %_lib.so,%,$(l)): $(l)))

# ---------------------------------------------------------------- tests
# The unit tests' own files are gtest cases around calls into the library,
# which stays at $(OPT): unoptimized, they build in about half the time.
UNIT_OPT ?= -O0
$(patsubst %.cc,$(BUILD)/obj/%.o,$(UNIT_SRCS)): CXXFLAGS_BASE += $(UNIT_OPT)
$(UNIT_BIN): $(patsubst %.cc,$(BUILD)/obj/%.o,$(UNIT_SRCS)) $(TESTHOOK_OBJS) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -o $@ $(filter %.o,$^) -Wl,--whole-archive $(CORE_A) -Wl,--no-whole-archive \
	  -lgtest -lgtest_main $(LIB_LIBS)

# The fuzz targets (clang, ASan) build here beside the rest, on every core:
# e2e 20 and 42 then find them built (the peer channel's alone took over
# three minutes of one core when e2e 20 built it).
test: deps
	$(MAKE) -j$(JOBS) all $(UNIT_BIN) $(TPROG_BINS) $(TPROG_LIBS) $(FUZZ_BIN) $(PEER_FUZZ_BIN) $(AGENT_FUZZ_BIN)
	test/run

test-unit: $(UNIT_BIN)
	$(UNIT_BIN)

# The README's first command: a 4-rank all-to-all while h1's leaf uplink to
# spine s1 is black-holed (4 guests, 2 rails, 2 spines), without and with
# libshunt, side by side.
demo: deps
	$(MAKE) -j$(JOBS) all
	$(BUILD)/bin/shunt-bench scenario blackhole --link l1r0-s1 --ranks 4 --duration 30 --out $(BUILD)/demo

# ---------------------------------------------------------------- sanitizers
asan:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" OPT=-O1 build-asan/test/unit_tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build-asan/test/unit_tests

tsan:
	$(MAKE) BUILD=build-tsan SAN="-fsanitize=thread" OPT=-O1 build-tsan/test/unit_tests
	TSAN_OPTIONS=halt_on_error=1 build-tsan/test/unit_tests

# ---------------------------------------------------------------- bench
$(MICRO_BIN): $(patsubst %.cc,$(BUILD)/obj/%.o,$(MICRO_SRCS)) $(TESTHOOK_OBJS) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CXX) -o $@ $(filter %.o,$^) -Wl,--whole-archive $(CORE_A) -Wl,--no-whole-archive \
	  -lbenchmark -lpthread $(LIB_LIBS)

bench: deps
	$(MAKE) -j$(JOBS) all $(MICRO_BIN)
	bench/run

# A long job on the guests, no fault and then random faults (over 100
# minutes with the defaults; SOAK_MINUTES, SOAK_FAULT_MINUTES, SOAK_MODES).
soak: deps
	$(MAKE) -j$(JOBS) all
	bench/soak/run.sh

# ---------------------------------------------------------------- install
install: all
	install -d $(DESTDIR)$(PREFIX)/lib/shunt $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(SHUNT_SO) $(DESTDIR)$(PREFIX)/lib/shunt/libshunt.so
	install -m 0755 $(RDMACM_SHIM) $(DESTDIR)$(PREFIX)/lib/shunt/libshunt-rdmacm.so
	for b in $(TOOL_BINS) $(TOOL_SCRIPTS); do install -m 0755 $$b $(DESTDIR)$(PREFIX)/bin/; done
	install -d $(DESTDIR)$(PREFIX)/share/shunt/tools/guest  # shunt-fabric's guest (PREFIX/share/shunt)
	install -m 0755 tools/guest/* $(DESTDIR)$(PREFIX)/share/shunt/tools/guest/
	install -d $(DESTDIR)$(PREFIX)/share/shunt/tools/shunt_fabric  # and its package
	install -m 0644 tools/shunt_fabric/*.py $(DESTDIR)$(PREFIX)/share/shunt/tools/shunt_fabric/
	for p in $(MAN_STATIC) $(MAN_GEN); do s=$${p##*.}; install -d $(DESTDIR)$(PREFIX)/share/man/man$$s; \
	  install -m 0644 $$p $(DESTDIR)$(PREFIX)/share/man/man$$s/; done

# Rewrites the configuration table of docs/configuration.md from the registry.
config-table: $(BUILD)/bin/shuntctl
	$(BUILD)/bin/shuntctl config --markdown > $(BUILD)/config-table.md
	python3 -c 'import sys,re; r=open("docs/configuration.md").read(); t=open(sys.argv[1]).read(); \
	  open("docs/configuration.md","w").write(re.sub(r"(<!-- config:begin -->\n).*?(<!-- config:end -->)", lambda m: m.group(1)+t+m.group(2), r, flags=re.S))' $(BUILD)/config-table.md

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c')

clean:
	rm -rf build build-asan build-tsan

-include $(shell find $(BUILD) -name '*.d' -type f 2>/dev/null)
