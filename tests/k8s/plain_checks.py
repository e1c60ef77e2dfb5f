"""tests/k8s/plain_checks.py: the checks of examples/k8s that need only
python3-yaml (what each Job, the etcd StatefulSet, the NetworkPolicies and
the images must be for a user of the example; see tests/k8s_yaml.sh)."""
import glob
import os
import re
import shlex

from manifests import (CPU_IMAGE, PLACEHOLDER, VAR, by_name, check, d, docs, env_value, file_of, flags, objs, one,
                       port_of, result)


def run():
    # ---- the Jobs and their dcomm-run command lines ----
    RUN_VALUED = {"nproc-per-node", "restart-policy", "max-restarts", "min-nproc", "nnodes",
                  "rdzv-backend", "rdzv-endpoint", "rdzv-id", "bind-to"}


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


    def job_checks(job):
        jf = file_of(job)
        st = {"job": job}
        tag = "%s (Job %s)" % (jf, job["metadata"]["name"])

        def setup():
            tmpl = job["spec"]["template"]
            st["pod"] = tmpl["spec"]
            for c in tmpl["spec"]["containers"]:
                argv = run_argv(c)
                if argv is not None:
                    st["c"] = c
                    st["opts"], st["prog"] = parse_run(argv)
                    return None
            return "no container of the Job runs dcomm-run"

        check("%s: a container runs dcomm-run" % tag, setup)
        opts = st.get("opts")

        def need_run():
            if opts is None:
                raise LookupError("no dcomm-run command line")

        def t_indexed():
            s = job["spec"]
            if s.get("completionMode") != "Indexed":
                return "completionMode is %r" % s.get("completionMode")
            if not isinstance(s.get("parallelism"), int) or s.get("parallelism") != s.get("completions"):
                return "parallelism %r, completions %r" % (s.get("parallelism"), s.get("completions"))

        check("%s: Indexed with parallelism == completions" % tag, t_indexed)

        def t_lifecycle():
            s = job["spec"]
            rules = (s.get("successPolicy") or {}).get("rules") or []
            if not any(r.get("succeededCount") == 1 and "succeededIndexes" not in r for r in rules):
                return "no successPolicy rule succeededCount: 1 over all indexes"
            if st["pod"].get("restartPolicy") != "Never":
                return "restartPolicy is %r" % st["pod"].get("restartPolicy")
            if not isinstance(s.get("backoffLimit"), int) or s["backoffLimit"] < 1:
                return "backoffLimit %r replaces no lost pod" % s.get("backoffLimit")

        check("%s: ends when one pod succeeded, replaces a failed pod by a new one (backoffLimit >= 1)" % tag,
              t_lifecycle)

        def t_failure_policy():
            need_run()
            rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
            if st["pod"].get("restartPolicy") != "Never":
                return "podFailurePolicy needs restartPolicy: Never"
            fail = [r for r in rules if r.get("action") == "FailJob" and r.get("onExitCodes")]
            if not fail:
                return "no FailJob rule on exit codes"
            ec = fail[0]["onExitCodes"]
            if ec.get("containerName", st["c"]["name"]) != st["c"]["name"]:
                return "the FailJob rule names container %r, dcomm-run runs in %r" % (ec.get("containerName"), st["c"]["name"])
            if ec.get("operator") != "In" or sorted(ec.get("values") or []) != [2]:
                return "FailJob on %s %s: dcomm-run's bad arguments are exit code 2 alone" % (ec.get("operator"), ec.get("values"))
            ign = [r for r in rules if r.get("action") == "Ignore" and
                   any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions") or [])]
            if not ign:
                return "no rule Ignore on the pod condition DisruptionTarget"

        check("%s: podFailurePolicy: exit code 2 of dcomm-run fails the Job (FailJob), DisruptionTarget is ignored"
              % tag, t_failure_policy)

        def t_deadlines():
            need_run()
            s = job["spec"]
            ttl, ads = s.get("ttlSecondsAfterFinished"), s.get("activeDeadlineSeconds")
            if not isinstance(ttl, int) or ttl < 0:
                return "ttlSecondsAfterFinished %r" % ttl
            if not isinstance(ads, int) or ads <= 0:
                return "activeDeadlineSeconds %r" % ads
            t = int(env_value(st["c"], "DCOMM_TIMEOUT") or 60)
            if ads <= t:
                return "activeDeadlineSeconds %d <= DCOMM_TIMEOUT %d: the Job may end while its first world waits" % (ads, t)

        check("%s: ttlSecondsAfterFinished and activeDeadlineSeconds (above DCOMM_TIMEOUT) are set" % tag, t_deadlines)

        def t_spread():
            s = job["spec"]
            labels = s["template"]["metadata"]["labels"]
            for c in st["pod"].get("topologySpreadConstraints") or []:
                ml = (c.get("labelSelector") or {}).get("matchLabels") or {}
                if c.get("topologyKey") == "kubernetes.io/hostname" and ml and \
                        all(labels.get(k) == v for k, v in ml.items()):
                    if c.get("whenUnsatisfiable") != "DoNotSchedule":
                        return "whenUnsatisfiable is %r" % c.get("whenUnsatisfiable")
                    if c.get("maxSkew") != 1:
                        return "maxSkew %r" % c.get("maxSkew")
                    if c.get("minDomains") != s.get("parallelism"):
                        return "minDomains %r != parallelism %r: a machine could get a second pod" % (
                            c.get("minDomains"), s.get("parallelism"))
                    return None
            return "no topologySpreadConstraint on kubernetes.io/hostname over the Job's pods"

        check("%s: one pod per machine (topologySpreadConstraints DoNotSchedule, maxSkew 1, minDomains = parallelism)"
              % tag, t_spread)

        def t_backend():
            need_run()
            if opts.get("rdzv-backend") != "etcd":
                return "--rdzv-backend is %r" % opts.get("rdzv-backend")

        check("%s: dcomm-run --rdzv-backend etcd" % tag, t_backend)

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

        check("%s: --rdzv-endpoint names the client Service of etcd.yaml (or its members) and a port etcd serves there"
              % tag, t_endpoint)

        def t_id():
            need_run()
            v = opts.get("rdzv-id")
            if not v:
                return "no --rdzv-id"
            names = {e["name"] for e in st["c"].get("env") or []}
            missing = [m for m in VAR.findall(v) if m not in names]
            if missing:
                return "--rdzv-id %s uses undefined %s" % (v, missing)

        check("%s: --rdzv-id is given (from the container's env)" % tag, t_id)

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

        check("%s: --nnodes MIN:MAX with MAX == the Job's parallelism" % tag, t_nnodes)

        def t_nproc():
            need_run()
            v = opts.get("nproc-per-node", "")
            if not re.fullmatch(r"\d+", v) or not 1 <= int(v) <= 4096:
                return "--nproc-per-node %r" % v
            if opts.get("restart-policy", "shrink") not in ("shrink", "replace"):
                return "--restart-policy %s is refused with etcd" % opts["restart-policy"]

        check("%s: --nproc-per-node N (and a restart policy the etcd backend takes)" % tag, t_nproc)

        def t_gpu():
            need_run()
            lim = (st["c"].get("resources") or {}).get("limits") or {}
            gpus = lim.get("nvidia.com/gpu")
            backend = env_value(st["c"], "DCOMM_BACKEND")
            if gpus is None and backend is None:
                return None  # a CPU job
            if backend != "nccl":
                return "nvidia.com/gpu %r with DCOMM_BACKEND %r" % (gpus, backend)
            if gpus is None or int(gpus) != int(opts.get("nproc-per-node", 0)):
                return "nvidia.com/gpu limit %r != --nproc-per-node %r (one GPU per worker)" % (
                    gpus, opts.get("nproc-per-node"))
            for name in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG"):
                if env_value(st["c"], name) is None:
                    return "no %s" % name

        check("%s: a GPU job sets DCOMM_BACKEND=nccl, NCCL_SOCKET_IFNAME, NCCL_DEBUG and one GPU per worker" % tag, t_gpu)

        def t_ckpt():
            need_run()
            prog = st["prog"]
            if not prog:
                return "no program after dcomm-run's options"
            ck = flags(prog[1:]).get("checkpoint-dir")
            if not ck:
                return "the program gets no --checkpoint-dir"
            mounts = [m for m in st["c"].get("volumeMounts") or [] if m["mountPath"].rstrip("/") == ck.rstrip("/")]
            if not mounts:
                return "no volume mounted at %s" % ck
            vols = {v["name"]: v for v in st["pod"].get("volumes") or []}
            v = vols.get(mounts[0]["name"])
            claim = ((v or {}).get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                return "the volume at %s is not a claim" % ck
            pvc = by_name("PersistentVolumeClaim", claim)
            if pvc is None:
                return "no PersistentVolumeClaim %s in the files" % claim
            if "ReadWriteMany" not in pvc["spec"].get("accessModes", []):
                return "claim %s is %s, not ReadWriteMany" % (claim, pvc["spec"].get("accessModes"))
            pf = file_of(pvc)
            if any(f == pf for f, x in docs if x.get("kind") == "Job"):
                return "claim %s is in %s with a Job: deleting that file would delete the checkpoints" % (claim, pf)

        check("%s: --checkpoint-dir is the mount of a ReadWriteMany claim kept in a file without a Job" % tag, t_ckpt)

        def t_grace():
            g = st["pod"].get("terminationGracePeriodSeconds", 30)
            if not isinstance(g, int) or g <= 10:
                return "terminationGracePeriodSeconds %r" % g

        check("%s: terminationGracePeriodSeconds > 10 (dcomm-run SIGKILLs its workers 10 s after forwarding SIGTERM)"
              % tag, t_grace)


    jobs = objs("Job")
    result(len(jobs) >= 2, "a Job in job.yaml and one in job-gpu.yaml (found %d)" % len(jobs))
    for job in jobs:
        job_checks(job)


    # ---- images ----
    def t_images():
        readme = open(os.path.join(d, "README.md")).read()
        if not re.search(r"[Rr]eplace", readme):
            return "README.md does not say to replace the placeholder images"
        seen = set()
        for job in jobs:
            for c in job["spec"]["template"]["spec"]["containers"]:
                img = c.get("image", "")
                if not img.startswith(PLACEHOLDER):
                    return "%s: image %s is not under the placeholder %s" % (job["metadata"]["name"], img, PLACEHOLDER)
                if img not in readme:
                    return "image %s is not named in README.md" % img
                seen.add(img)
        if CPU_IMAGE not in seen:
            return "no Job runs %s, the image the Dockerfile's example builds" % CPU_IMAGE
        df = open(os.path.join(d, "Dockerfile")).read()
        if CPU_IMAGE not in df:
            return "the Dockerfile's build command does not tag %s" % CPU_IMAGE


    check("the Jobs' images are %s... placeholders, named in README.md and the Dockerfile" % PLACEHOLDER, t_images)

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


    def t_etcd_anti():
        sts = one("StatefulSet")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        aa = (sts["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity") or {}
        for t in aa.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            ml = (t.get("labelSelector") or {}).get("matchLabels") or {}
            if t.get("topologyKey") == "kubernetes.io/hostname" and ml and \
                    all(labels.get(k) == v for k, v in ml.items()):
                return None
        return "no requiredDuringSchedulingIgnoredDuringExecution term on kubernetes.io/hostname over the members"


    check("the etcd members never share a machine (required podAntiAffinity on kubernetes.io/hostname)", t_etcd_anti)


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
        for x in objs("PodDisruptionBudget") + objs("NetworkPolicy"):
            sel = x["spec"].get("selector") or x["spec"].get("podSelector") or {}
            if not pods_matching(sel.get("matchLabels") or {}):
                bad.append("%s %s selects no pods" % (x["kind"], x["metadata"]["name"]))
        if bad:
            return "; ".join(bad)


    def pod_templates():
        out = []
        for f, x in docs:
            tmpl = (x.get("spec") or {}).get("template")
            if tmpl:
                out.append((x, (tmpl.get("metadata") or {}).get("labels") or {}, tmpl["spec"]))
        return out


    def pods_matching(ml):
        return [x for x, labels, _ in pod_templates() if all(labels.get(k) == v for k, v in ml.items())]


    check("the label selectors (StatefulSet, spreading, anti-affinity, disruption budget, network policies) "
          "select their own pods", t_selectors)

    # ---- network policies ----
    NS = "default"


    def np_peer_matches(peer, pod):
        """pod: (namespace, labels). A peer with only a podSelector means this
        namespace; an ipBlock matches no pod here."""
        if "ipBlock" in peer:
            return False
        ps, nsel = peer.get("podSelector"), peer.get("namespaceSelector")
        ns_labels = {"kubernetes.io/metadata.name": pod[0]}
        if nsel is None and pod[0] != NS:
            return False
        if nsel is not None and any(ns_labels.get(k) != v for k, v in (nsel.get("matchLabels") or {}).items()):
            return False
        return all(pod[1].get(k) == v for k, v in ((ps or {}).get("matchLabels") or {}).items())


    def np_rule_matches(rule, key, other, port, proto):
        peers = rule.get(key)
        if peers is not None and not any(np_peer_matches(p, other) for p in peers):
            return False
        ports = rule.get("ports")
        if ports is None:
            return True
        for p in ports:
            if p.get("protocol", "TCP") != proto:
                continue
            lo = p.get("port")
            if lo is None or (lo <= port <= p.get("endPort", lo)):
                return True
        return False


    def np_allows(src, dst, port, proto="TCP"):
        """src, dst: (namespace, labels). Allowed when the source's egress and
        the destination's ingress both allow it (an unselected side allows all)."""
        for side, me, other, ptype, key, rkey in ((0, src, dst, "Egress", "egress", "to"),
                                                  (1, dst, src, "Ingress", "ingress", "from")):
            pols = [p for p in objs("NetworkPolicy") if me[0] == NS and ptype in (p["spec"].get("policyTypes") or ["Ingress"])
                    and all(me[1].get(k) == v for k, v in (p["spec"]["podSelector"].get("matchLabels") or {}).items())]
            if pols and not any(np_rule_matches(r, rkey, other, port, proto)
                                for p in pols for r in p["spec"].get(key) or []):
                return False
        return True


    def t_netpol():
        if not objs("NetworkPolicy"):
            return "no NetworkPolicy in the files"
        sts = one("StatefulSet")
        etcd = (NS, sts["spec"]["template"]["metadata"]["labels"])
        ef = flags(sts["spec"]["template"]["spec"]["containers"][0].get("args") or [])
        client = port_of(ef.get("listen-client-urls", ""))[1]
        peer = port_of(ef.get("listen-peer-urls", ""))[1]
        dns = ("kube-system", {"k8s-app": "kube-dns"})
        other = (NS, {"app": "something-else"})
        bad = []
        for job in jobs:
            me = (NS, job["spec"]["template"]["metadata"]["labels"])
            name = job["metadata"]["name"]
            for j2 in jobs:  # this job's own pods and the other job's
                peer_pod = (NS, j2["spec"]["template"]["metadata"]["labels"])
                if j2 is job:
                    for port in (1024, 40000, 65535):
                        if not np_allows(me, peer_pod, port):
                            bad.append("%s pods cannot reach each other on port %d" % (name, port))
            if not np_allows(me, etcd, client):
                bad.append("%s cannot reach etcd on %d" % (name, client))
            if not (np_allows(me, dns, 53, "UDP") and np_allows(me, dns, 53, "TCP")):
                bad.append("%s cannot reach the cluster DNS" % name)
            if np_allows(other, me, 40000):
                bad.append("any pod reaches %s: the policy does not isolate it" % name)
        if not np_allows(etcd, etcd, peer):
            bad.append("etcd members cannot reach each other on %d" % peer)
        if not np_allows(etcd, dns, 53, "UDP"):
            bad.append("etcd cannot reach the cluster DNS")
        if np_allows(other, etcd, client):
            bad.append("any pod reaches etcd: the policy does not isolate it")
        if bad:
            return "; ".join(bad)


    check("NetworkPolicy: the jobs' pods reach each other on any port and etcd on its client port, "
          "members reach each other on the peer port, DNS works, other pods are kept out", t_netpol)


    def t_vars():
        bad = []
        for f, x in docs:
            spec = x.get("spec") or {}
            tmpl = spec.get("template")
            if not tmpl:
                continue
            for c in tmpl["spec"].get("containers", []):
                names = {e["name"] for e in c.get("env") or []}
                for a in (c.get("command") or []) + (c.get("args") or []) + \
                        [m.get("subPathExpr", "") for m in c.get("volumeMounts") or []]:
                    bad += ["%s/%s: $(%s)" % (x["metadata"]["name"], c["name"], m)
                            for m in VAR.findall(str(a)) if m not in names]
        if bad:
            return "undefined: " + ", ".join(bad)


    check("every $(VAR) in a container's command, args and subPathExpr is defined in its env", t_vars)


    def t_comments():
        bad = [os.path.basename(f) for f in glob.glob(os.path.join(d, "*"))
               if os.path.isfile(f) and not f.endswith(".md") and not open(f).read().startswith("#")]
        if bad:
            return "no leading comment: %s" % ", ".join(sorted(bad))


    check("every file of examples/k8s but README.md starts with a comment", t_comments)
