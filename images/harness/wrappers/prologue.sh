# Finds the bundle root H from this script's own path ($0 is the path the shell was given, so
# this works at /.orchard/harness, at any other mount point and through symlinks).
_s=$0
case $_s in */*) ;; *) _s=$(command -v "$_s") || _s=/.orchard/harness/bin/$ORCHARD_TOOL ;; esac
while [ -h "$_s" ]; do
  _l=$(readlink "$_s") || break
  case $_l in /*) _s=$_l ;; *) _s=${_s%/*}/$_l ;; esac
done
case $_s in /*) ;; *) _s=$PWD/$_s ;; esac
H=${_s%/@SELFDIR@/*}
. "$H/lib/orchard-harness.sh"
