# The peer channel's fuzz target (libFuzzer, ASan+UBSan), built with clang
# like the probe parser's (mk/clocksync.mk); not part of `all`. The code a
# request reaches (session, frames, both request handlers) is compiled here
# with clang, instrumented; the rest of what the handlers call (config,
# logging, the verbs registry) comes uninstrumented from the core archive.
PEER_FUZZ_BIN  := $(BUILD)/fuzz/peer_session_fuzz
PEER_FUZZ_SRCS := peer/wire.cc peer/session.cc agent/peer_service.cc \
                  $(wildcard interpose/verbs/bundle/*.cc) core/json_text.cc
PEER_FUZZ_OBJS := $(patsubst %.cc,$(BUILD)/fuzz/obj/%.o,$(PEER_FUZZ_SRCS))
# Its objects unoptimized by default: at -O1 clang takes 4x as long over
# the bundle's files (about 40 s each, minutes of `make test` on 2 cores),
# and e2e 20's 30000 inputs run in seconds either way. Long runs:
# make fuzz-peer PEER_FUZZ_OPT=-O1 (after removing $(BUILD)/fuzz/obj).
PEER_FUZZ_OPT  ?= -O0

.PHONY: fuzz-peer
fuzz-peer: $(PEER_FUZZ_BIN)
$(BUILD)/fuzz/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(subst -O1,$(PEER_FUZZ_OPT),$(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_FLAGS))) $(DEFS) -MMD -MP -c $< -o $@
$(PEER_FUZZ_BIN): test/fuzz/peer_session_fuzz.cc $(PEER_FUZZ_OBJS) $(CORE_A)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) $(DEFS) -o $@ test/fuzz/peer_session_fuzz.cc $(PEER_FUZZ_OBJS) $(CORE_A) \
	  $(LIB_LIBS)
