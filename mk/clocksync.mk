# clocksync: probe authentication needs libsodium in the library itself; the
# bench compares against chrony; the fuzz target is built with clang's
# libFuzzer (ASan on) and is not part of `all`.
# chrony is left out on purpose: installing it starts a daemon that disciplines
# the clock; bench/clocksync.sh reports its row as missing without it.
DEB_PACKAGES += libsodium-dev iperf3 clang python3 iproute2
LIB_LIBS += -lsodium
TOOL_LIBS_shunt-probe :=

FUZZ_CXX      ?= clang++
FUZZ_FLAGS    := -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer \
                 -D_GNU_SOURCE -I.
FUZZ_BIN      := $(BUILD)/fuzz/probe_parser_fuzz

.PHONY: fuzz
fuzz: $(FUZZ_BIN)
$(FUZZ_BIN): test/fuzz/probe_parser_fuzz.cc clocksync/wire.cc clocksync/wire.h
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -o $@ test/fuzz/probe_parser_fuzz.cc clocksync/wire.cc -lsodium
