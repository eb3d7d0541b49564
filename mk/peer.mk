# The peer channel's fuzz target (libFuzzer, ASan+UBSan), built with clang
# like the probe parser's (mk/clocksync.mk); not part of `all`.
PEER_FUZZ_BIN := $(BUILD)/fuzz/peer_session_fuzz

.PHONY: fuzz-peer
fuzz-peer: $(PEER_FUZZ_BIN)
$(PEER_FUZZ_BIN): test/fuzz/peer_session_fuzz.cc interpose/peer/wire.cc interpose/peer/wire.h \
    interpose/peer/session.cc interpose/peer/session.h
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -o $@ test/fuzz/peer_session_fuzz.cc interpose/peer/wire.cc \
	  interpose/peer/session.cc -lsodium
