# telemetry: promtool checks the /metrics exposition in the tests; the
# launch forms of shunt-run are tested under torchrun (python3-torch) and
# Open MPI; shuntctl top is tested in a terminal (tmux).
DEB_PACKAGES += prometheus python3-torch openmpi-bin tmux
