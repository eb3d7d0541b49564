"""The fabric's topology: names and addresses of hosts, leaves, spines and
the links between them (Topo), derived from the configuration alone."""
import re


class Topo:
    """Names and addresses, derived from (hosts, rails, spines, hosts/leaf).

    Host hI NIC rR: 10.R.I.2/24, its leaf port 10.R.I.1 (one /24 per port).
    Leaf lKrR (rack K, rail R) uplink to spine sJ: 192.168.X.(4(J-1)+1)/30 on
    the leaf, .+1 on the spine, X = (K-1)*rails + R.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.name = cfg["name"]
        self.hosts = ["h%d" % i for i in range(1, cfg["hosts"] + 1)]
        self.rails = cfg["rails"]
        self.spines = ["s%d" % j for j in range(1, cfg["spines"] + 1)]
        per = cfg["hosts_per_leaf"]
        self.racks = (cfg["hosts"] + per - 1) // per
        self.leaves = ["l%dr%d" % (k, r) for k in range(1, self.racks + 1)
                       for r in range(self.rails)]

    def ns(self, node):
        return "sf-%s-%s" % (self.name, node)

    def hidx(self, host):
        return int(host[1:])

    def rack(self, host):
        return (self.hidx(host) - 1) // self.cfg["hosts_per_leaf"] + 1

    def leaf_of(self, host, rail):
        return "l%dr%d" % (self.rack(host), rail)

    def leaf_index(self, leaf):
        k, r = map(int, re.match(r"l(\d+)r(\d+)$", leaf).groups())
        return (k - 1) * self.rails + r

    def leaf_hosts(self, leaf):
        k, r = map(int, re.match(r"l(\d+)r(\d+)$", leaf).groups())
        return [h for h in self.hosts if self.rack(h) == k]

    def host_addr(self, host, rail):
        return "10.%d.%d.2" % (rail, self.hidx(host))

    def port_addr(self, host, rail):
        return "10.%d.%d.1" % (rail, self.hidx(host))

    def port_net(self, host, rail):
        return "10.%d.%d.0/24" % (rail, self.hidx(host))

    def uplink_addrs(self, leaf, spine):
        x = self.leaf_index(leaf)
        j = int(spine[1:])
        base = 4 * (j - 1)
        return "192.168.%d.%d" % (x, base + 1), "192.168.%d.%d" % (x, base + 2)

    def mac(self, host, rail):
        i = self.hidx(host)
        return "52:54:00:%02x:%02x:%02x" % (i >> 8, i & 255, rail)

    def port_mac(self, host, rail):
        """The leaf's side of a guest's tap: fixed, so each end can hold the
        other's address as a permanent neighbour (see qemu_argv)."""
        i = self.hidx(host)
        return "52:54:01:%02x:%02x:%02x" % (i >> 8, i & 255, rail)

    def links(self):
        """name -> dict(kind, ends: [(ns-node, ifname), ...], ...)"""
        out = {}
        for h in self.hosts:
            for r in range(self.rails):
                leaf = self.leaf_of(h, r)
                out["%s-r%d" % (h, r)] = {"kind": "host", "host": h, "rail": r,
                                          "leaf": leaf, "leaf_if": h,
                                          "a": "%s/r%d" % (h, r), "b": "%s/%s" % (leaf, h)}
        for leaf in self.leaves:
            for s in self.spines:
                out["%s-%s" % (leaf, s)] = {"kind": "uplink", "leaf": leaf, "spine": s,
                                            "leaf_if": s, "spine_if": leaf,
                                            "a": "%s/%s" % (leaf, s), "b": "%s/%s" % (s, leaf)}
        return out
