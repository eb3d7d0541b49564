# The emulated fabric (tools/shunt-fabric, test/fabric/): qemu TCG guests
# with soft-RoCE, namespace routers, and the guest kernel they boot.
DEB_PACKAGES += qemu-system-x86 busybox-static kmod iproute2 nftables \
  rdma-core ibverbs-utils perftest libfabric-bin gzip

GUEST_DIR := $(BUILD)/guest

.PHONY: guest
# Debian's current kernel + a busybox initramfs; quick when already built.
guest: apt-deps
	@tools/guest/build-guest $(GUEST_DIR)

deps:: guest
