# sockets: the host agent speaks generic netlink (mptcp_pm) and sock_diag
# through libmnl; the tests and benchmarks run PyTorch Gloo, Open MPI,
# iperf3 and Debian's mptcpize in network namespaces (nft for black holes).
DEB_PACKAGES += libmnl-dev iproute2 nftables iperf3 mptcpize python3-torch openmpi-bin libopenmpi-dev
LIB_LIBS += -lmnl
