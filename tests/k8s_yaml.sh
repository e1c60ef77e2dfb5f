#!/usr/bin/env bash
# tests/k8s_yaml.sh: checks the Kubernetes example (examples/k8s/*.yaml)
# for what a user of it relies on: every document is a well-formed object;
# the Job is Indexed with parallelism == completions, ends when one pod
# succeeded, and replaces lost pods; its pods run dcomm-run with the etcd
# rendezvous, an --rdzv-endpoint that is the client Service of etcd.yaml
# (or its members) on a port that reaches etcd's client port, --rdzv-id,
# --nnodes MIN:MAX with MAX == parallelism and --nproc-per-node; the
# checkpoint directory is the mount of a ReadWriteMany claim; the grace
# period covers dcomm-run's 10 s SIGTERM forwarding; the etcd StatefulSet
# has as many replicas as --initial-cluster has members, named after its
# pods and its headless Service; every $(VAR) in the arguments is defined.
# Environment: top_srcdir (default .), PYTHON (a python3 with the yaml
# module, Debian's python3-yaml). Exit status: 0 pass, 1 fail, 77 skip.
set -u
dir=${top_srcdir:-.}/examples/k8s

py=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import yaml' 2>/dev/null; then
    py=$c
    break
  fi
done
if [ -z "$py" ]; then
  echo "skip: no python3 with the yaml module (apt-get install python3-yaml)"
  exit 77
fi

exec "$py" - "$dir" <<'EOF'
import glob, os, re, shlex, sys
import yaml

d = sys.argv[1]
n = passed = failed = 0


def result(ok, name, why=""):
    global n, passed, failed
    n += 1
    if ok:
        passed += 1
        print("ok %d - %s" % (n, name))
    else:
        failed += 1
        print("not ok %d - %s%s" % (n, name, " (%s)" % why if why else ""))


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
for need in ("etcd.yaml", "job.yaml"):
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


def objs(kind):
    return [x for _, x in docs if isinstance(x, dict) and x.get("kind") == kind]


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


VAR = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

# ---- the Job and its dcomm-run command line ----
RUN_VALUED = {"nproc-per-node", "restart-policy", "max-restarts", "min-nproc", "nnodes",
              "rdzv-backend", "rdzv-endpoint", "rdzv-id"}


def parse_run(argv):
    """dcomm-run's own options (as run_args.c reads them) and the program."""
    opts, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("--"):
            break
        name, eq, val = a[2:].partition("=")
        name = name.replace("_", "-")
        if name == "quiet-prefix":
            opts[name] = ""
        elif name in RUN_VALUED:
            if not eq:
                i += 1
                val = argv[i]
            opts[name] = val
        else:
            raise ValueError("dcomm-run does not know option %s" % a)
        i += 1
    return opts, argv[i:]


def run_argv(c):
    argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
    for k, a in enumerate(argv):
        if os.path.basename(a) == "dcomm-run":
            return argv[k + 1:]
    for a in argv:  # sh -c "... dcomm-run ..."
        if "dcomm-run" in a and " " in a:
            w = shlex.split(a)
            for k, b in enumerate(w):
                if os.path.basename(b) == "dcomm-run":
                    return w[k + 1:]
    return None


state = {}


def job_setup():
    job = one("Job")
    state["job"] = job
    tmpl = job["spec"]["template"]
    state["pod"] = tmpl["spec"]
    for c in tmpl["spec"]["containers"]:
        argv = run_argv(c)
        if argv is not None:
            state["c"] = c
            state["opts"], state["prog"] = parse_run(argv)
            return None
    return "no container of the Job runs dcomm-run"


check("job.yaml: one Job whose container runs dcomm-run", job_setup)
job, opts = state.get("job"), state.get("opts")


def need_run():
    if opts is None:
        raise LookupError("no dcomm-run command line")


def t_indexed():
    s = job["spec"]
    if s.get("completionMode") != "Indexed":
        return "completionMode is %r" % s.get("completionMode")
    if not isinstance(s.get("parallelism"), int) or s.get("parallelism") != s.get("completions"):
        return "parallelism %r, completions %r" % (s.get("parallelism"), s.get("completions"))


check("the Job is Indexed with parallelism == completions", t_indexed)


def t_lifecycle():
    s = job["spec"]
    rules = (s.get("successPolicy") or {}).get("rules") or []
    if not any(r.get("succeededCount") == 1 and "succeededIndexes" not in r for r in rules):
        return "no successPolicy rule succeededCount: 1 over all indexes"
    if state["pod"].get("restartPolicy") != "Never":
        return "restartPolicy is %r" % state["pod"].get("restartPolicy")
    if not isinstance(s.get("backoffLimit"), int) or s["backoffLimit"] < 1:
        return "backoffLimit %r replaces no lost pod" % s.get("backoffLimit")


check("the Job ends when one pod succeeded, and replaces a failed pod by a new one (backoffLimit >= 1)",
      t_lifecycle)


def t_backend():
    need_run()
    if opts.get("rdzv-backend") != "etcd":
        return "--rdzv-backend is %r" % opts.get("rdzv-backend")


check("dcomm-run --rdzv-backend etcd", t_backend)


def t_endpoint():
    """Each endpoint is a Service of the etcd pods (through it, to a port
    etcd listens on) or one member by its pod DNS name."""
    need_run()
    eps = opts.get("rdzv-endpoint")
    if not eps:
        return "no --rdzv-endpoint"
    sts = one("StatefulSet")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    etcd_c = sts["spec"]["template"]["spec"]["containers"][0]
    ef = flags(etcd_c.get("args") or [])
    listen = {port_of(u)[1] for u in ef.get("listen-client-urls", "").split(",") if u}
    members = ["%s-%d" % (sts["metadata"]["name"], i) for i in range(sts["spec"]["replicas"])]
    for ep in eps.split(","):
        host, port = port_of(ep.strip())
        part = host.split(".")
        svc = by_name("Service", part[0])
        if svc is None:
            if len(part) > 1 and part[0] in members and part[1] == sts["spec"]["serviceName"]:
                if port not in listen:
                    return "%s: etcd listens for clients on %s" % (ep, sorted(listen))
                continue
            return "%s: no Service named %r, nor an etcd member" % (ep, part[0])
        sel = svc["spec"].get("selector") or {}
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            return "Service %s does not select the etcd pods" % svc["metadata"]["name"]
        sp = [p for p in svc["spec"]["ports"] if p["port"] == port]
        if not sp:
            return "%s: Service %s has no port %r (it has %s)" % (
                ep, svc["metadata"]["name"], port, [p["port"] for p in svc["spec"]["ports"]])
        if svc["spec"].get("clusterIP") == "None":  # its names resolve to the pods themselves
            cport = port
        else:
            tp = sp[0].get("targetPort", port)
            cports = {p.get("name"): p["containerPort"] for p in etcd_c.get("ports") or []}
            cport = cports.get(tp) if isinstance(tp, str) else tp
            if cport is None:
                return "targetPort %r is no port of the etcd container" % tp
        if cport not in listen:
            return "%s reaches port %s of the etcd pods; etcd listens for clients on %s" % (ep, cport, sorted(listen))
    return None


check("--rdzv-endpoint names the client Service of etcd.yaml (or its members) and a port etcd serves there",
      t_endpoint)


def t_id():
    need_run()
    v = opts.get("rdzv-id")
    if not v:
        return "no --rdzv-id"
    names = {e["name"] for e in state["c"].get("env") or []}
    missing = [m for m in VAR.findall(v) if m not in names]
    if missing:
        return "--rdzv-id %s uses undefined %s" % (v, missing)


check("--rdzv-id is given (from the container's env)", t_id)


def t_nnodes():
    need_run()
    v = opts.get("nnodes", "")
    m = re.fullmatch(r"(\d+):(\d+)", v)
    if not m:
        return "--nnodes %r is not MIN:MAX" % v
    lo, hi = int(m.group(1)), int(m.group(2))
    if not 1 <= lo <= hi:
        return "--nnodes %s: need 1 <= MIN <= MAX" % v
    if hi != job["spec"].get("parallelism"):
        return "MAX %d != parallelism %r" % (hi, job["spec"].get("parallelism"))


check("--nnodes MIN:MAX with MAX == the Job's parallelism", t_nnodes)


def t_nproc():
    need_run()
    v = opts.get("nproc-per-node", "")
    if not re.fullmatch(r"\d+", v) or not 1 <= int(v) <= 4096:
        return "--nproc-per-node %r" % v
    if opts.get("restart-policy", "shrink") not in ("shrink", "replace"):
        return "--restart-policy %s is refused with etcd" % opts["restart-policy"]


check("--nproc-per-node N (and a restart policy the etcd backend takes)", t_nproc)


def t_ckpt():
    need_run()
    prog = state["prog"]
    if not prog:
        return "no program after dcomm-run's options"
    f = flags(prog[1:])
    ck = f.get("checkpoint-dir")
    if not ck:
        return "the program gets no --checkpoint-dir"
    mounts = [m for m in state["c"].get("volumeMounts") or [] if m["mountPath"].rstrip("/") == ck.rstrip("/")]
    if not mounts:
        return "no volume mounted at %s" % ck
    vols = {v["name"]: v for v in state["pod"].get("volumes") or []}
    v = vols.get(mounts[0]["name"])
    claim = ((v or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        return "the volume at %s is not a claim" % ck
    pvc = by_name("PersistentVolumeClaim", claim)
    if pvc is None:
        return "no PersistentVolumeClaim %s in the files" % claim
    if "ReadWriteMany" not in pvc["spec"].get("accessModes", []):
        return "claim %s is %s, not ReadWriteMany" % (claim, pvc["spec"].get("accessModes"))


check("--checkpoint-dir is the mount path of a ReadWriteMany claim defined with the Job", t_ckpt)


def t_grace():
    g = state["pod"].get("terminationGracePeriodSeconds", 30)
    if not isinstance(g, int) or g <= 10:
        return "terminationGracePeriodSeconds %r" % g


check("terminationGracePeriodSeconds > 10 (dcomm-run SIGKILLs its workers 10 s after forwarding SIGTERM)",
      t_grace)

# ---- etcd ----


def t_members():
    sts = one("StatefulSet")
    name, reps = sts["metadata"]["name"], sts["spec"]["replicas"]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    f = flags(c.get("args") or [])
    ic = [e for e in f.get("initial-cluster", "").split(",") if e]
    if len(ic) != reps:
        return "replicas %r, --initial-cluster has %d members" % (reps, len(ic))
    peer_port = port_of(f.get("listen-peer-urls", ""))[1]
    svc = sts["spec"]["serviceName"]
    want = ["%s-%d" % (name, i) for i in range(reps)]
    got = []
    for e in ic:
        m, _, url = e.partition("=")
        host, port = port_of(url)
        got.append(m)
        if not host.startswith("%s.%s." % (m, svc)):
            return "member %s is at %s, not under %s.%s" % (m, host, m, svc)
        if port != peer_port:
            return "member %s: peer port %r, etcd listens on %r" % (m, port, peer_port)
    if sorted(got) != sorted(want):
        return "members %s, pods %s" % (got, want)


check("the etcd StatefulSet's replicas == the members of --initial-cluster (its pods, on its peer port)",
      t_members)


def t_headless():
    sts = one("StatefulSet")
    svc = by_name("Service", sts["spec"]["serviceName"])
    if svc is None:
        return "no Service %s (the StatefulSet's serviceName)" % sts["spec"]["serviceName"]
    if svc["spec"].get("clusterIP") != "None":
        return "Service %s is not headless" % svc["metadata"]["name"]
    if svc["spec"].get("publishNotReadyAddresses") is not True:
        return "Service %s hides members that are not ready yet" % svc["metadata"]["name"]


check("the StatefulSet's serviceName is a headless Service that publishes members before they are ready",
      t_headless)


def t_selectors():
    bad = []
    for f, x in docs:
        spec = x.get("spec") or {}
        tmpl = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")
        if not tmpl:
            continue
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        ps = tmpl["spec"]
        sels = [c.get("labelSelector") for c in ps.get("topologySpreadConstraints") or []]
        for kind in ("podAntiAffinity", "podAffinity"):
            a = (ps.get("affinity") or {}).get(kind) or {}
            sels += [t.get("podAffinityTerm", t).get("labelSelector")
                     for k in a.values() for t in k]
        if "selector" in spec:
            sels.append(spec["selector"])
        for s in sels:
            ml = (s or {}).get("matchLabels") or {}
            if not ml or any(labels.get(k) != v for k, v in ml.items()):
                bad.append("%s %s: %s" % (x["kind"], x["metadata"]["name"], ml))
    for x in objs("PodDisruptionBudget"):
        ml = x["spec"]["selector"].get("matchLabels") or {}
        if not any(all(((t.get("spec") or {}).get("template", {}).get("metadata", {}).get("labels") or {}).get(k) == v
                       for k, v in ml.items()) for _, t in docs):
            bad.append("PodDisruptionBudget %s selects no pods" % x["metadata"]["name"])
    if bad:
        return "; ".join(bad)


check("the label selectors (StatefulSet, spreading, anti-affinity, disruption budget) select their own pods",
      t_selectors)


def t_vars():
    bad = []
    for f, x in docs:
        spec = x.get("spec") or {}
        tmpl = spec.get("template")
        if not tmpl:
            continue
        for c in tmpl["spec"].get("containers", []):
            names = {e["name"] for e in c.get("env") or []}
            for a in (c.get("command") or []) + (c.get("args") or []):
                bad += ["%s/%s: $(%s)" % (x["metadata"]["name"], c["name"], m)
                        for m in VAR.findall(str(a)) if m not in names]
    if bad:
        return "undefined: " + ", ".join(bad)


check("every $(VAR) in a container's command and args is defined in its env", t_vars)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed or not n else 0)
EOF
