# shunt-bench: the benchmark harness (tools/shunt-bench) and its scenario
# script, installed next to the binary so `shunt-bench scenario` finds it.

DEB_PACKAGES += gnuplot-nox libcli11-dev nlohmann-json3-dev

BENCH_OBJS := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard tools/shunt-bench/*.cc))
# Keep the objects between builds (they are intermediates of a pattern rule).
.SECONDARY: $(BENCH_OBJS)
