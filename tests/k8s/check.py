"""tests/k8s/check.py: the checks of examples/k8s, run by tests/k8s_yaml.sh as
check.py DIR SRC BUILDDIR: the manifests are loaded (manifests.py), the
plain checks run (plain_checks.py), then the schema check
(schema_check.py). Prints TAP lines and "N passed, M failed"; exits 0, 1,
or 77 when the schema check could not run and everything else passed."""
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree

import manifests  # noqa: E402
import plain_checks  # noqa: E402
import schema_check  # noqa: E402

plain_checks.run()
skip = schema_check.run()
passed, failed = manifests.passed, manifests.failed
if skip and not failed:
    print("%d passed, %d failed" % (passed, failed))
    print("skip: %s (the %d checks above passed)" % (skip, passed))
    sys.exit(77)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed or not manifests.n else 0)
