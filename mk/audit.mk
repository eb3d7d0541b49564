# shunt-audit's judgement (tools/shunt-audit/verdict.cc) is pure: the unit
# tests link it beside the core archive.
AUDIT_VERDICT_OBJ := $(BUILD)/obj/tools/shunt-audit/verdict.o
$(UNIT_BIN): $(AUDIT_VERDICT_OBJ)
