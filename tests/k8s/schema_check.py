"""tests/k8s/schema_check.py: validates every document of examples/k8s against
the Kubernetes API schema with the npm package kubernetes-models (installed
into a cache folder on first use; validate.js runs it under node), strict
about fields the schema does not know, and checks that broken copies of
job.yaml are rejected. run() returns a reason to skip (no node, npm or
registry), or None."""
import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile

import yaml

from manifests import KM_PACKAGE, KM_VERSION, K8S_SCHEMA, builddir, d, docs, result, src

VALIDATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "validate.js")


def run_bounded(argv, timeout, **kw):
    """subprocess.run with a timeout that kills the whole process group."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, "", "timed out after %d s" % timeout
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


def schema_dir():
    if os.environ.get("K8S_SCHEMA_DIR"):
        return os.environ["K8S_SCHEMA_DIR"]
    if builddir and os.path.realpath(builddir) != os.path.realpath(src):
        return os.path.join(builddir, "tests", "k8s-schema")
    t = tempfile.mkdtemp(prefix="dcomm-k8s-schema.")
    atexit.register(shutil.rmtree, t, True)
    return t


def setup_validator():
    """The folder that holds node_modules/kubernetes-models, or a reason."""
    node = os.environ.get("NODE") or shutil.which("node") or shutil.which("nodejs")
    if not node:
        return None, None, "no node (apt-get install nodejs npm)"
    rc, o, e = run_bounded([node, "-e", "process.exit(+process.versions.node.split('.')[0] >= 14 ? 0 : 1)"], 30)
    if rc != 0:
        return None, None, "node is older than 14 or does not run (%s)" % (e.strip() or rc)
    where = os.path.abspath(schema_dir())
    pj = os.path.join(where, "node_modules", KM_PACKAGE, "package.json")
    try:
        have = json.load(open(pj)).get("version")
    except (OSError, ValueError):
        have = None
    if have != KM_VERSION:
        npm = os.environ.get("NPM") or shutil.which("npm")
        if not npm:
            return None, None, "no npm to install %s@%s (apt-get install npm)" % (KM_PACKAGE, KM_VERSION)
        os.makedirs(where, exist_ok=True)
        env = dict(os.environ, npm_config_fetch_retries="1", npm_config_fetch_timeout="30000",
                   npm_config_update_notifier="false")
        t = int(os.environ.get("K8S_NPM_TIMEOUT", "120"))
        rc, o, e = run_bounded([npm, "install", "--prefix", where, "--no-audit", "--no-fund", "--no-package-lock",
                                "--ignore-scripts", "--prefer-offline", "--loglevel=error",
                                "%s@%s" % (KM_PACKAGE, KM_VERSION)], t, env=env, cwd=where)
        if rc != 0:
            lines = [l for l in (e or "").splitlines() if l.strip() and "complete log" not in l]
            last = [l for l in lines if " code " in l or "ERR" in l][:1] or lines[-1:] or [str(rc)]
            return None, None, "npm install %s@%s failed (no registry?): %s" % (KM_PACKAGE, KM_VERSION, last[0][:200])
    return node, where, None


def validate(node, where, items):
    """items: [(id, doc)] -> {id: [errors]}, or raises."""
    with tempfile.TemporaryDirectory(prefix="dcomm-k8s-validate.") as t:
        inp = os.path.join(t, "docs.json")
        json.dump([{"id": i, "doc": x} for i, x in items], open(inp, "w"))
        rc, o, e = run_bounded([node, VALIDATOR, where, inp], 120)
        if rc != 0:
            raise RuntimeError("node: %s" % (e.strip()[-300:] or rc))
        return {r["id"]: r["errors"] for r in json.loads(o)}


def run():
    node, where, why = setup_validator()
    skip = None
    if why:
        skip = "schema check: %s" % why
        print("# skip %s" % skip)
    else:
        label = "Kubernetes %s schema (%s %s)" % (K8S_SCHEMA, KM_PACKAGE, KM_VERSION)
        items = [("%s#%d" % (f, k), x) for k, (f, x) in enumerate(docs)]
        # Broken copies of job.yaml: each must be rejected, naming the field.
        job_text = open(os.path.join(d, "job.yaml")).read()
        broken = [("a misspelled field (topologySpreadConstraint)", "topologySpreadConstraints:",
                   "topologySpreadConstraint:", "topologySpreadConstraint"),
                  ("a misspelled field (onExitCode)", "onExitCodes:", "onExitCode:", "onExitCode"),
                  ("a wrong enum value (whenUnsatisfiable: DoNotScheduled)", "whenUnsatisfiable: DoNotSchedule",
                   "whenUnsatisfiable: DoNotScheduled", "whenUnsatisfiable"),
                  ("a string for an integer (backoffLimit: six)", "backoffLimit: 6", "backoffLimit: six",
                   "backoffLimit")]
        for k, (what, old, new, field) in enumerate(broken):
            if old not in job_text:
                result(False, "schema check: job.yaml has %r to break" % old)
                continue
            bad = [x for x in yaml.safe_load_all(job_text.replace(old, new, 1)) if isinstance(x, dict) and x.get("kind") == "Job"]
            items.append(("broken#%d" % k, bad[0]))
        try:
            got = validate(node, where, items)
        except Exception as e:
            got = None
            result(False, "schema check runs (%s)" % label, str(e))
        if got is not None:
            for i, x in items:
                if i.startswith("broken#"):
                    continue
                errs = got.get(i)
                result(errs == [], "%s: %s %s is valid against the %s" % (
                    i.split("#")[0], x.get("kind"), x["metadata"].get("name"), label), "; ".join(errs or ["no answer"]))
            for k, (what, old, new, field) in enumerate(broken):
                errs = got.get("broken#%d" % k)
                if errs is None:
                    continue
                result(bool(errs) and any(field in e for e in errs),
                       "the schema check rejects job.yaml with %s" % what,
                       "; ".join(errs) if errs else "accepted")
                if errs:
                    print("#   %s" % "; ".join(errs)[:300])
    return skip
