"""prom_panels.py URL DASHBOARD [PREFIX...]: every panel's query of a Grafana
dashboard, with its variables at "All", run through a Prometheus server's
HTTP API at URL; each must return data, except where a metric it names has
no samples at all and starts with one of the PREFIXes (metrics the hosts
scraped cannot have: RDMA's on hosts without it). Also checks the
dashboard's variables (job, instance, shunt_job) have values and that its
bundle-path, failover and clock panels are there. Exit 0, or 1 with FAIL."""
import json
import re
import sys
import urllib.parse
import urllib.request

base, dash, allowed = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])


def query(e):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": e})
    d = json.load(urllib.request.urlopen(url, timeout=10))
    assert d["status"] == "success", (url, d)
    return d["data"]["result"]


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


def at_all(e):
    return e.replace("$job", ".*").replace("$instance", ".*").replace("$shunt_job", ".*")


d = json.load(open(dash))
names = {v["name"] for v in d["templating"]["list"]}
if not {"job", "instance", "shunt_job"} <= names:
    fail("dashboard variables: %s" % names)
for v in d["templating"]["list"]:
    if v["type"] == "query" and not query(at_all(re.sub(r"label_values\((.*), *\w+\)$", r"\1", v["definition"]))):
        fail("variable %s has no values" % v["name"])
titles = [p["title"] for p in d["panels"]]
for want in ("Bundle paths up (of all)", "Carrier paths", "Bundle path send rate", "Bundle path failures",
             "Failovers, failbacks, replays", "Clock offset and bound", "Clock model valid", "Clock drift"):
    if want not in titles:
        fail("no panel '%s'" % want)
with_data = without = 0
for p in d["panels"]:
    for t in p.get("targets", []):
        e = at_all(t["expr"])
        if query(e):
            with_data += 1
            continue
        names = set(re.findall(r"\b(shunt_[a-z_]+)\b", re.sub(r"\b(by|without)\s*\([^)]*\)|\{[^}]*\}", "", e)))
        absent = [m for m in names if not query("count(%s)" % m)]
        if not absent or not allowed or any(not m.startswith(allowed) for m in absent):
            fail("panel '%s': no data from %s" % (p["title"], e))
        without += 1
        print("no samples on these hosts (%s): %s" % (", ".join(sorted(absent)), p["title"]))
print("%d panel queries returned data, %d name metrics without samples here" % (with_data, without))
