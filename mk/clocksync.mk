# clocksync: probe authentication needs libsodium in the library itself; the
# bench compares against chrony; the fuzz target is built with clang's
# libFuzzer (ASan on) and is not part of `all`.
# chrony is not installed: installing it starts a daemon that disciplines the
# clock. `make bench` unpacks Debian's package into $(BUILD)/chrony instead
# (apt-get download + dpkg-deb -x: no maintainer scripts, no service) and
# bench/clocksync.sh runs that chronyd -x, which never touches the clock.
DEB_PACKAGES += libsodium-dev iperf3 clang python3 iproute2
DEB_PACKAGES += libcap2 libedit2 libgnutls30 libnettle8 libseccomp2  # the unpacked chrony's libraries

bench: bench-chrony
.PHONY: bench-chrony
bench-chrony: deps
	@if ! command -v chronyd >/dev/null && [ ! -x $(BUILD)/chrony/usr/sbin/chronyd ]; then \
	  rm -rf $(BUILD)/chrony-deb && mkdir -p $(BUILD)/chrony-deb && \
	  (cd $(BUILD)/chrony-deb && apt-get download chrony) && \
	  dpkg-deb -x $(BUILD)/chrony-deb/chrony_*.deb $(BUILD)/chrony && \
	  echo "chrony unpacked into $(BUILD)/chrony (for bench/clocksync.sh)"; \
	fi
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
