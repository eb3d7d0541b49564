# shunt-audit's judgement (tools/shunt-audit/verdict.cc, and mesh.cc for the
# probe mesh) is pure: the unit tests link it beside the core archive.
AUDIT_VERDICT_OBJ := $(BUILD)/obj/tools/shunt-audit/verdict.o $(BUILD)/obj/tools/shunt-audit/mesh.o
$(UNIT_BIN): $(AUDIT_VERDICT_OBJ)
# e2e 26 has Debian's Chromium render the HTML report (headless, in a
# network namespace of its own).
DEB_PACKAGES += chromium
