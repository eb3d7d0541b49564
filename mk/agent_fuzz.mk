# The agent's inputs fuzz target (test/fuzz/agent_inputs_fuzz.cc: control
# socket lines, metrics endpoint requests, settings), libFuzzer with
# ASan+UBSan like the peer channel's (mk/peer.mk, whose object rule builds
# these): the files that parse those inputs are compiled with clang,
# instrumented; the rest comes from the core archive.
AGENT_FUZZ_BIN  := $(BUILD)/fuzz/agent_inputs_fuzz
AGENT_FUZZ_SRCS := agent/agent.cc telemetry/http_server.cc core/config.cc
AGENT_FUZZ_OBJS := $(patsubst %.cc,$(BUILD)/fuzz/obj/%.o,$(AGENT_FUZZ_SRCS))

.PHONY: fuzz-agent
fuzz-agent: $(AGENT_FUZZ_BIN)
$(AGENT_FUZZ_BIN): test/fuzz/agent_inputs_fuzz.cc $(AGENT_FUZZ_OBJS) $(CORE_A)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) $(DEFS) -o $@ test/fuzz/agent_inputs_fuzz.cc $(AGENT_FUZZ_OBJS) $(CORE_A) \
	  $(LIB_LIBS)
