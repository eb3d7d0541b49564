"""Building the network: namespaces and their sysctls, the routers (leaves
and spines, their nftables table and ECMP routes) and namespace hosts."""
from .common import sh


ROUTER_SYSCTLS = [
    ("net.ipv4.ip_forward", 1),
    ("net.ipv4.fib_multipath_hash_policy", 1),
    ("net.ipv4.conf.all.rp_filter", 0),
    ("net.ipv4.conf.default.rp_filter", 0),
    ("net.ipv4.conf.all.ignore_routes_with_linkdown", 1),
    ("net.ipv4.conf.default.ignore_routes_with_linkdown", 1),
    ("net.ipv6.conf.all.disable_ipv6", 1),
    ("net.ipv6.conf.default.disable_ipv6", 1),
]
HOST_SYSCTLS = [
    ("net.ipv4.conf.all.rp_filter", 0),
    ("net.ipv4.conf.default.rp_filter", 0),
    ("net.ipv6.conf.all.disable_ipv6", 1),
    ("net.ipv6.conf.default.disable_ipv6", 1),
]

NFT_TABLE = """table inet shunt_fabric {
  set drop_ifs { type ifname; }
  chain fwd_drop { type filter hook forward priority -10; iifname @drop_ifs drop; oifname @drop_ifs drop; }
  chain in_drop { type filter hook input priority -10; iifname @drop_ifs drop; }
  chain out_drop { type filter hook output priority -10; oifname @drop_ifs drop; }
}
"""


def ip(ns, *args, check=True):
    return sh(["ip", "-n", ns] + list(args), check=check)


def nsexec(ns, *args, check=True, input=None):
    return sh(["ip", "netns", "exec", ns] + list(args), check=check, input=input)


def sysctls(ns, pairs):
    for k, v in pairs:
        with_ns = ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "%s=%s" % (k, v)]
        sh(with_ns)


def make_ns(topo, node, sysctl_pairs):
    ns = topo.ns(node)
    sh(["ip", "netns", "add", ns])
    ip(ns, "link", "set", "lo", "up")
    sysctls(ns, sysctl_pairs)
    return ns


def leaf_routes(topo, leaf):
    """(Re)installs the leaf's routes: ECMP over live spines for the fabric,
    and a fallback blackhole per own port so a downed port never loops."""
    ns = topo.ns(leaf)
    hops = []
    for s in topo.spines:
        _, spine_side = topo.uplink_addrs(leaf, s)
        hops += ["nexthop", "via", spine_side, "dev", s, "weight", "1"]
    ip(ns, "route", "replace", "10.0.0.0/8", *hops, check=False)
    rail = int(leaf.split("r")[-1])
    for h in topo.leaf_hosts(leaf):
        ip(ns, "route", "replace", "blackhole", topo.port_net(h, rail), "metric", "1000")


def spine_routes(topo, spine, only_leaf=None):
    ns = topo.ns(spine)
    for leaf in topo.leaves:
        if only_leaf and leaf != only_leaf:
            continue
        leaf_side, _ = topo.uplink_addrs(leaf, spine)
        rail = int(leaf.split("r")[-1])
        for h in topo.leaf_hosts(leaf):
            ip(ns, "route", "replace", topo.port_net(h, rail), "via", leaf_side, "dev", leaf,
               check=False)


# ECMP hash of the routers: l4 hashes the 5-tuple (Linux policy 1); sport
# hashes source and destination address and UDP/TCP source port only
# (policy 3, fields 0x0013), as RoCE fabrics often do since RoCE's
# destination port is always 4791: then a probe from a flow's source port
# to another destination port takes the flow's path.
HASH_SYSCTLS = {
    "l4": [("net.ipv4.fib_multipath_hash_policy", 1)],
    "sport": [("net.ipv4.fib_multipath_hash_policy", 3), ("net.ipv4.fib_multipath_hash_fields", 0x0013)],
}


def build_routers(topo):
    hashing = HASH_SYSCTLS[topo.cfg.get("ecmp_hash", "l4")]
    for node in topo.leaves + topo.spines:
        ns = make_ns(topo, node, ROUTER_SYSCTLS + hashing)
        nsexec(ns, "nft", "-f", "-", input=NFT_TABLE)
    for leaf in topo.leaves:
        for s in topo.spines:
            lns, sns = topo.ns(leaf), topo.ns(s)
            ip(lns, "link", "add", "name", s, "type", "veth", "peer", "name", leaf, "netns", sns)
            la, sa = topo.uplink_addrs(leaf, s)
            ip(lns, "addr", "add", la + "/30", "dev", s)
            ip(sns, "addr", "add", sa + "/30", "dev", leaf)
            ip(lns, "link", "set", s, "up")
            ip(sns, "link", "set", leaf, "up")


def leaf_port_up(topo, host, rail):
    leaf = topo.leaf_of(host, rail)
    ns = topo.ns(leaf)
    ip(ns, "addr", "replace", topo.port_addr(host, rail) + "/24", "dev", host)
    ip(ns, "link", "set", host, "up")
    if topo.cfg["kind"] == "vm":  # taking the port down flushed it
        ip(ns, "neigh", "replace", topo.host_addr(host, rail), "lladdr", topo.mac(host, rail),
           "dev", host, "nud", "permanent")


def build_ns_hosts(topo):
    for h in topo.hosts:
        hns = make_ns(topo, h, HOST_SYSCTLS)
        for r in range(topo.rails):
            leaf = topo.leaf_of(h, r)
            nic = "r%d" % r
            ip(hns, "link", "add", "name", nic, "address", topo.mac(h, r), "type", "veth",
               "peer", "name", h, "netns", topo.ns(leaf))
            ip(hns, "addr", "add", topo.host_addr(h, r) + "/24", "dev", nic)
            ip(hns, "link", "set", nic, "up")
            leaf_port_up(topo, h, r)
            ip(hns, "route", "add", "10.%d.0.0/16" % r, "via", topo.port_addr(h, r), "dev", nic)
