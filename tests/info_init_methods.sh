#!/bin/sh
# info_init_methods.sh: dcomm-info lists the init methods this build has
# (pmix:// with PMIx, etcd:// with etcd support, the others always) and
# that the libraries those two open at their first use are found, the
# sample in dcomm-info(1) shows a full build's list, dcomm_init(3)'s
# detection rule names pmix:// and slurm://, and DCOMM_INIT_METHOD's help
# (dcomm-info -e) names etcd://.
# Environment: top_srcdir, top_builddir (default .). Exit: 0 pass, 1 fail.

top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
info="$top_builddir/dcomm-info"
status=0
fail() {
  echo "info_init_methods: $*" >&2
  status=1
}

want="env:// tcp:// file://"
grep -q '^#define DCOMM_HAVE_PMIX 1' "$top_builddir/config.h" && want="$want pmix://"
want="$want slurm://"
grep -q '^#define DCOMM_HAVE_ETCD 1' "$top_builddir/config.h" && want="$want etcd://"

got=$("$info" | sed -n 's/^init methods: //p')
[ "$got" = "$want" ] || fail "dcomm-info prints 'init methods: $got', this build has '$want'"

# The libraries those two open at their first use are found here (the
# packages the tests install), and a process that lists them does not
# fail for it.
for m in pmix:// etcd://; do
  case " $want " in *" $m "*) ;; *) continue ;; esac
  "$info" | grep -q "^  $m opens lib[a-z]*\.so[.0-9]* when used: found$" ||
    fail "dcomm-info does not report $m's library as found: $("$info" | grep "^  $m" || echo none)"
done

grep -q '^init methods: env:// tcp:// file:// pmix:// slurm:// etcd://$' "$top_srcdir/man/man1/dcomm-info.1" ||
  fail "dcomm-info(1)'s sample does not list a full build's init methods"

desc=$(sed -n '/^\.SH DESCRIPTION/,/^\.SH RETURN/p' "$top_srcdir/man/man3/dcomm_init.3")
for m in pmix:// slurm:// etcd://; do
  echo "$desc" | grep -q "$m" || fail "dcomm_init(3) does not describe $m"
done

"$info" -e | sed -n '/^DCOMM_INIT_METHOD$/,+2p' | grep -q 'etcd://' || fail "DCOMM_INIT_METHOD's help does not name etcd://"

[ $status -eq 0 ] && echo "info_init_methods: dcomm-info lists '$got'; the pages agree"
exit $status
