# shunt-bench: the benchmark harness (tools/shunt-bench) and its scenario
# scripts (the scenario, contention and the scenario's report), installed
# next to the binary so `shunt-bench scenario` finds them.

DEB_PACKAGES += gnuplot-nox libcli11-dev nlohmann-json3-dev

BENCH_OBJS := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard tools/shunt-bench/*.cc))
# Keep the objects between builds (they are intermediates of a pattern rule).
.SECONDARY: $(BENCH_OBJS)

# The benchmark is the application under test: it links nothing of libshunt
# (unlike the other tools), so a run without LD_PRELOAD is a clean baseline.
$(BUILD)/bin/shunt-bench: $(BENCH_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -o $@ $(BENCH_OBJS) -libverbs -lpthread

all: $(BUILD)/bin/shunt-bench-scenario
$(BUILD)/bin/shunt-bench-scenario: tools/shunt-bench/scenario.sh
	@mkdir -p $(dir $@)
	install -m 0755 $< $@

all: $(BUILD)/bin/shunt-bench-contention
$(BUILD)/bin/shunt-bench-contention: tools/shunt-bench/contention.sh
	@mkdir -p $(dir $@)
	install -m 0755 $< $@

all: $(BUILD)/bin/shunt-bench-scenario-report
$(BUILD)/bin/shunt-bench-scenario-report: tools/shunt-bench/scenario_report.py
	@mkdir -p $(dir $@)
	install -m 0755 $< $@

install: bench-install-scenario
.PHONY: bench-install-scenario
bench-install-scenario: $(BUILD)/bin/shunt-bench-scenario $(BUILD)/bin/shunt-bench-contention \
  $(BUILD)/bin/shunt-bench-scenario-report
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $^ $(DESTDIR)$(PREFIX)/bin/
