#!/bin/sh
# man_pages.sh: every public function of the installed headers
# (include/dcomm.h, include/dcomm_elastic.h) has a page file under
# man/man3 (its own, or an alias ".so man3/<page>.3" whose target exists and
# names the function), every page is installed (listed in man/Makefile.inc),
# and every dcomm page a SEE ALSO section names exists.
# Environment: top_srcdir (default .). Exit status: 0 pass, 1 fail.

top_srcdir=${top_srcdir:-.}
man="$top_srcdir/man"
status=0
fail() {
  echo "man_pages: $*" >&2
  status=1
}

names=$(grep -h '^DCOMM_API' "$top_srcdir/include/dcomm.h" "$top_srcdir/include/dcomm_elastic.h" |
  sed 's/(.*//; s/.*[ *]//' | sort -u)
n=$(echo "$names" | grep -c .)
[ "$n" -ge 40 ] || fail "found only $n DCOMM_API functions in the headers (the extraction broke)"

for f in $names; do
  page="$man/man3/$f.3"
  if [ ! -f "$page" ]; then
    fail "$f has no page: add man/man3/$f.3 (a real page or '.so man3/<page>.3')"
    continue
  fi
  # An alias must point at a page that documents the function in NAME.
  target=$(sed -n '1s/^\.so  *//p' "$page")
  if [ -n "$target" ]; then
    if [ ! -f "$man/$target" ]; then
      fail "$page: .so target $target does not exist"
    elif ! sed -n '/^\.SH NAME/,/^\.SH /p' "$man/$target" | grep -qw "$f"; then
      fail "$page: $target does not name $f in its NAME section"
    fi
  elif ! sed -n '/^\.SH NAME/,/^\.SH /p' "$page" | grep -qw "$f"; then
    fail "$page: the NAME section does not name $f"
  fi
done

# Every .so target exists, and every page file is installed.
for page in "$man"/man[137]/*.[137]; do
  rel=${page#"$man"/}
  target=$(sed -n '1s/^\.so  *//p' "$page")
  [ -z "$target" ] || [ -f "$man/$target" ] || fail "$rel: .so target $target does not exist"
  grep -q "man/$rel\\b" "$man/Makefile.inc" || fail "man/$rel is not listed in man/Makefile.inc (not installed)"
done

# SEE ALSO: every dcomm page named there exists (pages of other projects,
# such as mpirun(1), are not checked).
for page in "$man"/man[137]/*.[137]; do
  refs=$(sed -n '/^\.SH SEE ALSO/,/^\.SH /p' "$page" | sed -n 's/^\.BR  *\([A-Za-z0-9_\\-]*\)  *(\([0-9]\)).*/\1 \2/p' |
    sed 's/\\-/-/g')
  echo "$refs" | while read -r ref sec; do
    [ -n "$ref" ] || continue
    case $ref in dcomm*) ;; *) continue ;; esac
    [ -f "$man/man$sec/$ref.$sec" ] || { echo "man_pages: ${page#"$man"/}: SEE ALSO names $ref($sec), which has no page" >&2; echo x; }
  done | grep -q x && status=1
done

[ $status -eq 0 ] && echo "man_pages: $n public functions, all with a page; SEE ALSO references resolve"
exit $status
