"""shunt-fabric's modules; tools/shunt-fabric is the command line.

paths      where the guest's files, the state and the entry point are
common     FabricError, die, sh
topology   names and addresses (Topo)
state      a fabric's state files (State)
network    namespaces, routers and their routes, namespace hosts
guests     qemu guests: booting, waiting for them, their monitor
hostexec   running commands on hosts (exec)
mux        one guest's connection shared among exec clients (_mux)
lifecycle  up and down
faults     fault injection (fault)
report     links, counters, hosts, addr, gid, wait-port, console
"""
