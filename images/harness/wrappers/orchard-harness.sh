# Orchard harness bundle: shared part of the wrappers in bin/ (installed as lib/orchard-harness.sh).
#
# POSIX sh only: it runs under busybox ash, dash and bash alike. It changes nothing outside
# the bundle and writes nothing, so the bundle works from a read-only mount. A wrapper sets
# ORCHARD_TOOL and H (the bundle root) and sources this file.
#
# How a wrapper picks a build: the image's C library is recognised by its loader, the way the
# kernel will look for it when it starts a dynamically linked program:
#   glibc  /lib64/ld-linux-x86-64.so.2, whose version `ld.so --version` tells
#   musl   /lib/ld-musl-x86_64.so.1
# Programs that cannot run on what the image has exit 127 with a message that says why.

ORCHARD_GLIBC_LD=/lib64/ld-linux-x86-64.so.2
ORCHARD_MUSL_LD=/lib/ld-musl-x86_64.so.1
ORCHARD_GLIBC_PROBED=
ORCHARD_GLIBC=

orchard_fail() {
  printf '%s: %s\n' "$ORCHARD_TOOL" "$*" >&2
  exit 127
}

# Sets ORCHARD_GLIBC to the image's glibc version ("2.36"), empty when the image has no glibc
# loader (busybox, Alpine, static-only images). A musl loader installed under the glibc name
# (Alpine's gcompat) does not print a glibc version and so counts as no glibc.
orchard_probe_glibc() {
  [ -n "${ORCHARD_GLIBC_PROBED:-}" ] && return 0
  ORCHARD_GLIBC_PROBED=1
  ORCHARD_GLIBC=
  [ -e "$ORCHARD_GLIBC_LD" ] || return 0
  _o=$("$ORCHARD_GLIBC_LD" --version 2>/dev/null) || _o=
  case $_o in
    *"release version "*) ;;
    *) return 0 ;;
  esac
  _o=${_o#*release version }
  _o=${_o%%[!0-9.]*}
  ORCHARD_GLIBC=${_o%.}
}

# orchard_version_ge A B: true when the dotted version A (major.minor) is B or newer.
orchard_version_ge() {
  _a1=${1%%.*} _b1=${2%%.*}
  _a2=${1#*.} _b2=${2#*.}
  _a2=${_a2%%.*} _b2=${_b2%%.*}
  [ "$_a1" -gt "$_b1" ] 2>/dev/null && return 0
  [ "$_a1" -eq "$_b1" ] 2>/dev/null && [ "$_a2" -ge "$_b2" ] 2>/dev/null
}

# orchard_glibc_ok MIN: true when the image has glibc MIN or newer.
orchard_glibc_ok() {
  orchard_probe_glibc
  [ -n "$ORCHARD_GLIBC" ] && orchard_version_ge "$ORCHARD_GLIBC" "$1"
}

orchard_has_musl() {
  [ -e "$ORCHARD_MUSL_LD" ]
}

# What the image has, in words, for the messages.
orchard_image_libc() {
  orchard_probe_glibc
  if [ -n "$ORCHARD_GLIBC" ]; then
    printf 'glibc %s' "$ORCHARD_GLIBC"
  elif orchard_has_musl; then
    printf 'musl (%s)' "$ORCHARD_MUSL_LD"
  elif [ -e "$ORCHARD_GLIBC_LD" ]; then
    printf '%s, which is not a glibc loader' "$ORCHARD_GLIBC_LD"
  else
    printf 'no C library loader (neither %s nor %s)' "$ORCHARD_GLIBC_LD" "$ORCHARD_MUSL_LD"
  fi
}

# orchard_has_lib NAME: true when NAME is in one of musl's default library directories.
orchard_has_lib() {
  for _d in /lib /usr/local/lib /usr/lib; do
    [ -e "$_d/$1" ] && return 0
  done
  return 1
}

# orchard_has_glibc_libs NAME...: true when every NAME is in one of the usual library
# directories of glibc distributions (Debian/Ubuntu multiarch, Fedora/RHEL lib64, plain).
orchard_has_glibc_libs() {
  for _n in "$@"; do
    _found=
    for _d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /usr/local/lib /lib /usr/lib; do
      if [ -e "$_d/$_n" ]; then _found=1; break; fi
    done
    [ -n "$_found" ] || return 1
  done
  return 0
}

# orchard_exec_glibc MIN_GLIBC "LIBS" EXTRA_LIBPATH ARGV0 PROGRAM [ARGS...]
# Runs a glibc program: directly on the image's glibc when it is MIN_GLIBC or newer and the
# image has the libraries LIBS, otherwise through the bundle's own glibc (lib/glibc, Debian's
# libc6), by calling its loader explicitly. --library-path applies to this one process: the
# commands the program starts see the image's libraries and environment unchanged. ARGV0 is
# what the program sees as argv[0] in that case (Python finds its prefix, and sys.executable,
# through it).
orchard_exec_glibc() {
  _min=$1 _libs=$2 _lp=$3 _argv0=$4 _prog=$5
  shift 5
  # shellcheck disable=SC2086 # LIBS is a list
  if orchard_glibc_ok "$_min" && orchard_has_glibc_libs $_libs; then
    exec "$_prog" "$@"
  fi
  exec "$H/lib/glibc/lib/ld-linux-x86-64.so.2" --library-path "$H/lib/glibc/lib${_lp:+:$_lp}" \
    --argv0 "$_argv0" "$_prog" "$@"
}
