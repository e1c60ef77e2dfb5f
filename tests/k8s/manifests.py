"""tests/k8s/manifests.py: what the checks of examples/k8s share (tests/k8s_yaml.sh
runs check.py, which imports it): the TAP counters and result()/check(),
every YAML document of the folder named by argv[1] loaded once (with a
result line per file and per document), and small lookups over them.
"""
import glob, os, re, sys

import yaml

# The folder of the manifests, the source tree and the build tree (maybe "").
d, src, builddir = sys.argv[1], sys.argv[2], sys.argv[3]
n = passed = failed = 0

KM_PACKAGE, KM_VERSION, K8S_SCHEMA = "kubernetes-models", "4.5.1", "1.33"
PLACEHOLDER = "registry.example.com/"
CPU_IMAGE = PLACEHOLDER + "dcomm:latest"


def result(ok, name, why=""):
    global n, passed, failed
    n += 1
    if ok:
        passed += 1
        print("ok %d - %s" % (n, name))
    else:
        failed += 1
        print("not ok %d - %s%s" % (n, name, " (%s)" % why if why else ""))
    sys.stdout.flush()


def check(name, fn):
    """fn returns None (pass) or a reason; an exception is a failure too."""
    try:
        why = fn()
    except Exception as e:  # a missing field, a wrong type
        why = "%s: %s" % (type(e).__name__, e)
    result(why is None, name, why or "")


# ---- load every document ----
docs = []  # (file, doc)
files = sorted(glob.glob(os.path.join(d, "*.yaml")))
for need in ("etcd.yaml", "job.yaml", "job-gpu.yaml", "ckpt-pvc.yaml", "networkpolicy.yaml"):
    result(os.path.join(d, need) in files, "%s exists in %s" % (need, d))
for f in files:
    try:
        with open(f) as fh:
            got = [x for x in yaml.safe_load_all(fh) if x is not None]
        docs += [(os.path.basename(f), x) for x in got]
        result(len(got) > 0, "%s parses (%d documents)" % (os.path.basename(f), len(got)))
    except yaml.YAMLError as e:
        result(False, "%s parses" % os.path.basename(f), str(e).replace("\n", " "))

for f, x in docs:
    ok = isinstance(x, dict) and x.get("apiVersion") and x.get("kind") and \
        isinstance(x.get("metadata"), dict) and x["metadata"].get("name")
    desc = "%s %s" % (x.get("kind"), (x.get("metadata") or {}).get("name")) if isinstance(x, dict) else repr(x)[:40]
    result(bool(ok), "%s: %s has apiVersion, kind and metadata.name" % (f, desc))
docs = [(f, x) for f, x in docs if isinstance(x, dict)]


def objs(kind):
    return [x for _, x in docs if x.get("kind") == kind]


def one(kind):
    l = objs(kind)
    if len(l) != 1:
        raise LookupError("expected one %s, found %d" % (kind, len(l)))
    return l[0]


def by_name(kind, name):
    for x in objs(kind):
        if x["metadata"]["name"] == name:
            return x
    return None


def file_of(obj):
    return next(f for f, x in docs if x is obj)


def flags(argv):
    """--name=value / --name value pairs of an argument list (etcd's style)."""
    out, i = {}, 0
    while i < len(argv):
        a = str(argv[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            else:
                k, v = a[2:], (str(argv[i + 1]) if i + 1 < len(argv) else "")
                i += 1
            out[k] = v
        i += 1
    return out


def port_of(url):
    m = re.match(r"^(?:[a-z]+://)?(\[[^]]*\]|[^:/]*)(?::(\d+))?", url)
    return m.group(1), (int(m.group(2)) if m.group(2) else None)


def env_value(c, name):
    for e in c.get("env") or []:
        if e["name"] == name:
            return e.get("value")
    return None


VAR = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
