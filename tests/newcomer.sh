#!/usr/bin/env bash
# tests/newcomer.sh: the newcomer test (issue 19). Every command that the
# README, the man pages and docs/ show is run as a new user would run it:
# against an installed dcomm only (make install DESTDIR=<scratch>, then
# PATH, LD_LIBRARY_PATH, PKG_CONFIG_PATH, MANPATH, PYTHONPATH into that
# root, never into the build tree), and the test fails on any that does
# not work as written.
#
# Extraction (automatic, so a doc changed later is checked again):
#   - README.md and docs/*.md: fenced code blocks (```, ```sh, ```console;
#     ```c and ```python blocks are kept as the files prog.c / prog.py that
#     the commands after them compile or run), indented code blocks, and
#     inline spans `man NAME`;
#   - man/man1/*.1, man/man3/*.3, man/man7/*.7: every .nf/.fi and .EX/.EE
#     block outside SYNOPSIS (EXAMPLES and the pages' other displayed
#     commands), roff escapes undone (\- \e \& \fX).
#   Lines ending in a backslash are joined. A line is a command only when
#   its first word (after "$ ", VAR=value assignments) is a program in
#   PROGRAMS below; every other line (C, Python, YAML, output samples,
#   prose, shell-script bodies) is not a command and is not counted.
# Classification: RULES below, first match wins: RUN, RUN:<rc> (documented
#   to exit with <rc>), or SKIP with the reason printed. Unmatched commands
#   fail the test ("no rule"): a new kind of command needs a rule.
# Substitutions (placeholders that can be filled safely), in SUBST below.
# Each RUN command runs with `timeout $NC_TIMEOUT` (60 s) under bash in a
# scratch directory of its source file (so README's `cc prog.c` is followed
# by the `./prog` it built). Output: one line per command, then the count
# per source and per outcome; fails if a command fails, a command has no
# rule, a source kind (README / man / docs) yields no command, or fewer
# than NC_MIN_RUN (10) commands ran.
# Environment: top_builddir, top_srcdir (default .), CC. Exit 0/1/77.
set -u
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "${top_srcdir:-.}" && pwd)
[ -f "$b/Makefile" ] || { echo "skip: no build tree at $b"; exit 77; }
command -v pkg-config >/dev/null || { echo "skip: pkg-config is not installed"; exit 77; }
T=$(mktemp -d /tmp/dcomm-newcomer.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$src/tests/lib.sh"
NC_TIMEOUT=${NC_TIMEOUT:-60}
NC_MIN_RUN=${NC_MIN_RUN:-10}

# ---- install into a scratch root -------------------------------------------
if ! install_scratch; then
  echo "not ok - make install DESTDIR=$T/root"; tail -20 "$T/install.log"; exit 1
fi
pylib=$(find "$R" -type d -name dcomm -path '*-packages/dcomm' | head -1)

# The environment of a new user of this install, and nothing of the build:
# the system's programs (cc, man, python3) and the installed dcomm.
unset DCOMM_RUN DCOMM_PLUGIN_PATH DCOMM_LIBRARY DCOMM_MAN7 top_builddir top_srcdir
for v in $(env | sed -n 's/^\(DCOMM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
mkdir -p "$T/wrap"
export PATH=$T/wrap:$R$prefix/bin:/usr/bin:/bin
export LD_LIBRARY_PATH=$R$libdir
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$R   # the .pc names $prefix; the files lie under $R
export MANPATH=$R$prefix/share/man
export PYTHONPATH=${pylib%/dcomm}
export DCOMM_LIBRARY=$R$libdir/libdcomm.so.0
[ -d "$R$libdir/dcomm" ] && export DCOMM_PLUGIN_PATH=$R$libdir/dcomm
# A sanitizer build's library needs its runtime: `cc` links with the same
# flags (a wrapper first on PATH), as tests/plugin_oot.sh does.
if [ -n "$san" ]; then
  realcc=$(PATH=/usr/bin:/bin command -v "${CC%% *}" || command -v cc)
  printf '#!/bin/sh\nexec %s "$@" %s\n' "$realcc" "$san" >"$T/wrap/cc"
  chmod +x "$T/wrap/cc"
fi
case $(command -v dcomm-run) in
  "$R"/*) ;;
  *) echo "not ok - dcomm-run on PATH is not the installed one: $(command -v dcomm-run)"; exit 1 ;;
esac
echo "# installed into $R (prefix $prefix): PATH=$PATH PYTHONPATH=$PYTHONPATH"
have_torch=0
python3 -c 'import torch' 2>/dev/null && have_torch=1

# ---- extraction: records "source<TAB>line<TAB>kind<TAB>text" ---------------
# kind: cmd (a candidate line, joined), c / py (a code block, \x01 for \n)
extract_md() { # file
  awk -v F="$1" '
    function flush_code() { if (code != "") print F "\t" cl "\t" ck "\t" code; code = "" }
    function emit(l, t) {
      if (pend != "") { t = pend " " t; l = pl; pend = "" }
      if (t ~ /\\$/) { sub(/[ \t]*\\$/, "", t); pend = t; pl = l; return }
      print F "\t" l "\t" "cmd" "\t" t
    }
    function flush_pend() { if (pend != "") print F "\t" pl "\t" "cmd" "\t" pend; pend = "" }
    /^[ \t]*```/ {
      if (infence) { infence = 0; flush_code(); flush_pend(); next }
      infence = 1; lang = $0; sub(/^[ \t]*```[ \t]*/, "", lang)
      ck = (lang == "c") ? "c" : (lang == "python" || lang == "py") ? "py" : ""
      cl = NR + 1; code = ""; next
    }
    infence {
      if (ck != "") { code = (code == "") ? $0 : code "\x01" $0; next }
      line = $0; sub(/^[ \t]+/, "", line); emit(NR, line); next
    }
    # indented block: four spaces after a blank line or another block line
    /^    / && (prevblank || inind) { inind = 1; line = $0; sub(/^ +/, "", line); emit(NR, line); prevblank = 0; next }
    { if (inind) flush_pend(); inind = 0; prevblank = ($0 ~ /^[ \t]*$/)
      # inline spans `man NAME`, `dcomm-info ...`, `pkg-config ...`
      s = $0
      while (match(s, /`(man [a-z0-9_.-]+|dcomm-info[^`]*|pkg-config [^`]+)`/)) {
        print F "\t" NR "\t" "cmd" "\t" substr(s, RSTART + 1, RLENGTH - 2)
        s = substr(s, RSTART + RLENGTH)
      }
    }
  ' "$1"
}
extract_man() { # file: .nf/.EX blocks outside SYNOPSIS, roff undone
  awk -v F="$1" '
    /^\.SH/ { sec = $0; next }
    /^\.(nf|EX)([ \t]|$)/ { if (sec !~ /SYNOPSIS/) { inb = 1; first = 1; code = "" }; next }
    /^\.(fi|EE)([ \t]|$)/ {
      inb = 0; if (pend != "") { print F "\t" pl "\t" "cmd" "\t" pend; pend = "" }
      if (code != "") print F "\t" cl "\t" "c" "\t" code
      code = ""; next
    }
    !inb { next }
    /^\.\\"/ { next }
    /^\.(RS|RE|PP|sp|br|in|ft)([ \t]|$)/ { next }
    {
      t = $0
      sub(/^\.(B|I|BR|IR) /, "", t)
      gsub(/\\f[BIRP]/, "", t); gsub(/\\f\(CW/, "", t); gsub(/\\-/, "-", t); gsub(/\\\(aq/, "\x27", t)
      gsub(/\\\(dq/, "\"", t); gsub(/\\&/, "", t); gsub(/\\e/, "\\", t); gsub(/\\\(ti/, "~", t)
      if (first && t ~ /^#include/) { incode = 1; cl = NR }
      else if (first) incode = 0
      first = 0
      if (incode) { code = (code == "") ? t : code "\x01" t; next }
      sub(/^[ \t]+/, "", t)
      if (pend != "") { t = pend " " t; l = pl; pend = "" } else l = NR
      if (t ~ /\\$/) { sub(/[ \t]*\\$/, "", t); pend = t; pl = l; next }
      print F "\t" l "\t" "cmd" "\t" t
    }
  ' "$1"
}

# ---- what is a command -----------------------------------------------------
# The first word (after "$ " and VAR=value words) must be one of these.
PROGRAMS='export|rm|dcomm-run|dcomm-info|dcomm-bench|cc|gcc|clang|python3|python|man|pkg-config|bash|sh|make|timeout|env|mpirun|srun|sbatch|salloc|kubectl|etcd|etcdctl|torchrun|sudo|apt-get|\./[A-Za-z0-9_./-]+|tests/[A-Za-z0-9_./-]+|scripts/[A-Za-z0-9_./-]+|/usr/local/[A-Za-z0-9_./-]+'
first_word() { # command -> $pw, its program word (VAR=value words, quoted too, skipped)
  local c=$1 re='^[A-Za-z_][A-Za-z0-9_]*=("[^"]*"|'"'[^']*'"'|[^ "'"'"']*)+ +'
  while [[ $c =~ $re ]]; do c=${c:${#BASH_REMATCH[0]}}; done
  pw=${c%% *}
}

# ---- rule table: ERE on the command | action | reason ----------------------
# First match wins. RUN: must exit 0. RUN:N: documented to exit N.
# SKIP:notorch, SKIP:python: python3 commands, run unless torch is missing
# (notorch) or the library has a sanitizer (python3 has not).
# ENV: an `export` line: kept and sourced before the later commands of the
# same source. ./prog, ./hello, ./sgd: what the docs' own cc lines build.
# The rules see the command without its trailing `# comment`.
RULES=(
  '^export [A-Za-z_]+=|ENV|'
  '(^|[ =])(mpirun|mpiexec)( |$)|SKIP|needs an MPI job (mpirun): tests/pmix_mpirun.sh covers it'
  '(^|[ =])(srun|sbatch|salloc)( |$)|SKIP|needs a SLURM cluster: tests/slurm_cluster.sh covers it'
  'kubectl|SKIP|needs a Kubernetes cluster'
  '--rdzv-backend etcd|etcd://|SKIP|needs the user'\''s etcd endpoints'
  'DCOMM_BACKEND=nccl|tests/gpu/|SKIP|needs a GPU'
  '(^| )(sudo|apt-get)( |$)|SKIP|root-only machine setup'
  '<[a-z_-]+>|/shared/|10\.0\.0\.|SKIP|a placeholder for the user'\''s hosts or shared storage'
  '(^|[ ;&|])\./(autogen\.sh|configure)|(^|[ ;&|])make( |$)|SKIP|build-tree command (autotools)'
  '(^|[ /])(tests|scripts)/|\.\./tests/|SKIP|build-tree script (tests/, scripts/; the perf ones take minutes)'
  '(^| )\./(dcomm-run|dcomm-bench|dcomm-info|examples/)|SKIP|build-tree program (./dcomm-run, ./examples/...)'
  '(^|[ ;&|])\./(prog|hello|sgd)( |;|&|$)|RUN|'
  '(^| )\./train( |$)|python3? train\.py|SKIP|the user'\''s own training program'
  '(^| )python3?( |$).*(prog\.py|torch)|SKIP:notorch|needs torch'
  '^man [a-z0-9_.-]+$|RUN|'
  '(^| )(cc|gcc|clang) |RUN|'
  '^pkg-config |RUN|'
  '(^|[ =])(dcomm-run|dcomm-info|dcomm-bench)( |$)|RUN|'
  '(^| )python3? (-c|-m) |SKIP:python|'
  '^/usr/local/libexec/dcomm/|RUN|'
)
classify() { # command -> "ACTION<TAB>reason"
  local r re act why
  for r in "${RULES[@]}"; do
    why=${r##*|}; r=${r%|*}; act=${r##*|}; re=${r%|*}
    if [[ $1 =~ $re ]]; then
      # python3 runs them here, unless torch is missing or the library is
      # built with a sanitizer (python3 is not; the plain build runs them)
      if [ "$act" = SKIP:notorch ] && [ $have_torch = 0 ]; then
        act=SKIP; why="needs torch (python3 cannot import it here)"
      elif [ "${act#SKIP:}" != "$act" ] && [ -n "$san" ]; then
        act=SKIP; why="python3 under a sanitizer build (the plain build runs it)"
      elif [ "${act#SKIP:}" != "$act" ]; then
        act=RUN
      fi
      printf '%s\t%s\n' "$act" "$why"; return
    fi
  done
  printf 'NORULE\tno rule in tests/newcomer.sh matches it\n'
}

# ---- substitutions: placeholder -> safe value (sed expressions) -------------
#  the install prefix                -> the same path under the scratch root
#  /tmp/x, /tmp/x2, /tmp/ckpt         -> ./ckpt-x.N (N: the command's number;
#                                        the docs show each as a fresh run), ./ckpt
#                                        (in code blocks too: "/tmp/ckpt")
#  port 29500 (:29500, MASTER_PORT=)  -> a free port
#  ./worker (any dcomm program)       -> the installed elastic demo, 10 steps
#  `man NAME` prints the page          -> its output is not needed: >/dev/null
substitute() { # command -> command to run
  local c=$1 port n=$((nrun + nenv))
  port=$(free_port)
  c=$(printf '%s' "$c" | sed -e "s#\(^\| \)$prefix/#\1$R$prefix/#g" \
    -e "s#\(^\| \)/usr/local/libexec/#\1$R$prefix/libexec/#g" \
    -e "s#/tmp/\(x2\?\)\b#./ckpt-\1.$n#g" -e 's#/tmp/ckpt\b#./ckpt#g' -e "s#\(:\|PORT=\)29500\b#\1$port#g" \
    -e "s#\(^\| \)\./worker\( \|$\)#\1$R$prefix/libexec/dcomm/elastic_sgd --steps 10 --checkpoint-every 5 --checkpoint-dir ./ckpt-w.$n\2#g")
  case $c in man\ *) c="$c >/dev/null" ;; esac
  printf '%s' "$c"
}

# ---- run ---------------------------------------------------------------------
cd "$src" || exit 1
sources="README.md $(ls docs/*.md) $(ls man/man1/*.1 man/man3/*.3 man/man7/*.7)"
: >"$T/records"
for f in $sources; do
  case $f in *.md) extract_md "$f" ;; *) extract_man "$f" ;; esac >>"$T/records"
done

declare -A found=() skips=()
nrun=0 nok=0 nfail=0 nskip=0 nnorule=0 nenv=0
progwords="^($PROGRAMS)$"
while IFS=$'\t' read -r f line kind text; do
  [ -n "${found[$f]+x}" ] || found[$f]=0
  dir=$T/work/${f//[\/.]/_}
  [ -d "$dir" ] || mkdir -p "$dir"
  case $kind in
    c | py) printf '%s\n' "$text" | tr '\001' '\n' | sed 's#"/tmp/ckpt"#"./ckpt"#g' >"$dir/last.$kind"; continue ;;
  esac
  cmd=${text#\$ }
  case $cmd in '#'*) continue ;; esac
  first_word "$cmd"
  [[ $pw =~ $progwords ]] || continue
  found[$f]=$((found[$f] + 1))
  IFS=$'\t' read -r act why < <(classify "$(printf '%s' "$cmd" | sed 's/[[:space:]]#.*//')")
  case $act in
    SKIP)
      nskip=$((nskip + 1)); skips[$why]=$((${skips[$why]:-0} + 1))
      echo "SKIP($why) $f:$line: $cmd"; continue ;;
    NORULE)
      nnorule=$((nnorule + 1))
      echo "not ok (no rule) $f:$line: $cmd"; continue ;;
  esac
  if [ "$act" = ENV ]; then
    substitute "$cmd" >>"$dir/env.sh"; echo >>"$dir/env.sh"
    nenv=$((nenv + 1)); echo "env $f:$line: $cmd"; continue
  fi
  want=0
  case $act in RUN:*) want=${act#RUN:} ;; esac
  run=$(substitute "$cmd")
  # A source file the command names that the doc does not create is the
  # code block shown before it (README's prog.c, the page's sgd.c).
  for w in $(set -f; echo $run); do
    case $w in
      *.c | *.py) [ -e "$dir/$w" ] || [ ! -e "$dir/last.${w##*.}" ] || cp "$dir/last.${w##*.}" "$dir/$w" ;;
    esac
  done
  nrun=$((nrun + 1))
  t0=$(date +%s%N)
  (cd "$dir" && touch env.sh && timeout "$NC_TIMEOUT" bash -c ". ./env.sh; $run") </dev/null >"$T/out" 2>&1
  rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  if [ "$rc" = "$want" ]; then
    nok=$((nok + 1)); echo "ok ($dt s) $f:$line: $cmd"
  else
    nfail=$((nfail + 1))
    to=; [ "$rc" = 124 ] && to=", timed out after $NC_TIMEOUT s"
    echo "not ok (exit $rc, wanted $want$to) $f:$line: $cmd"
    [ "$run" != "$cmd" ] && echo "#   ran: $run"
    tail -n 15 "$T/out" | sed 's/^/#   /'
  fi
done <"$T/records"

echo "# commands found per source:"
kinds_ok=1
for k in README.md docs/ man/; do
  tot=0 zero=
  for f in $sources; do
    case $f in
      "$k"*) tot=$((tot + ${found[$f]:-0}))
        if [ "${found[$f]:-0}" = 0 ]; then zero="$zero ${f##*/}"; else echo "#   $f: ${found[$f]}"; fi ;;
    esac
  done
  echo "#   total in $k: $tot${zero:+ (none in:$zero)}"
  [ "$tot" -gt 0 ] || { echo "not ok - no command found in $k (extraction broken?)"; kinds_ok=0; }
done
echo "# skipped by reason:"
for r in "${!skips[@]}"; do echo "#   ${skips[$r]}  $r"; done
echo "newcomer: found $((nrun + nskip + nnorule + nenv)), ran $nrun ($nok ok, $nfail failed), skipped $nskip, environment lines $nenv, without a rule $nnorule"
st=0
[ "$nfail" = 0 ] && [ "$nnorule" = 0 ] && [ $kinds_ok = 1 ] || st=1
if [ "$nrun" -lt "$NC_MIN_RUN" ]; then
  echo "not ok - only $nrun commands ran (at least $NC_MIN_RUN expected)"; st=1
fi
exit $st
