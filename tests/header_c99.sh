#!/bin/sh
# header_c99.sh: checks that the public header include/dcomm.h stands on its own:
# it must compile alone as strict C99 (-pedantic -Werror), survive being
# included twice, and, when a C++ compiler is found, compile as C++11 too.
# Environment: top_srcdir (default .), CC (default cc), CXX (default g++,
# else c++). Exit status: 0 pass, 1 fail, 77 skip (no C compiler).

top_srcdir=${top_srcdir:-.}
CC=${CC:-cc}
hdr="$top_srcdir/include/dcomm.h"

if [ ! -f "$hdr" ]; then
  echo "header_c99: $hdr not found" >&2
  exit 1
fi

# CC may carry options ("gcc -m32"); the first word must be a program.
set -- $CC
if ! command -v "$1" >/dev/null 2>&1; then
  echo "header_c99: no C compiler ($CC); skipping"
  exit 77
fi

status=0
cflags="-std=c99 -pedantic -Werror -Wall -Wextra -fsyntax-only"

if $CC $cflags -x c "$hdr"; then
  echo "header_c99: C99 alone: ok"
else
  echo "header_c99: $hdr does not compile on its own as C99" >&2
  status=1
fi

# Two inclusions must be harmless (include guards), and the installed
# plugin and elastic headers must stand with it.
if printf '#include "dcomm.h"\n#include "dcomm.h"\n#include "dcomm_plugin.h"\n#include "dcomm_elastic.h"\n#include "dcomm_plugin.h"\n' | $CC $cflags -I"$top_srcdir/include" -x c -; then
  echo "header_c99: C99 included twice: ok"
else
  echo "header_c99: $hdr fails when included twice" >&2
  status=1
fi

if [ -z "${CXX:-}" ]; then
  for c in g++ c++; do
    if command -v "$c" >/dev/null 2>&1; then
      CXX=$c
      break
    fi
  done
fi
if [ -n "${CXX:-}" ]; then
  set -- $CXX
  if command -v "$1" >/dev/null 2>&1; then
    if $CXX -std=c++11 -pedantic -Werror -Wall -Wextra -fsyntax-only -x c++ "$hdr"; then
      echo "header_c99: C++11 alone: ok"
    else
      echo "header_c99: $hdr does not compile as C++11" >&2
      status=1
    fi
  else
    echo "header_c99: C++ compiler $CXX not found; C++ check skipped"
  fi
else
  echo "header_c99: no C++ compiler; C++ check skipped"
fi

exit $status
