#!/usr/bin/env bash
# Installs a build of TensorFusion under a prefix:
#
#   bash scripts/install.sh [--prefix DIR] [BUILD_DIR]        (defaults: /usr/local, build)
#
# PREFIX/bin/tfusion, and under PREFIX/lib/tensorfusion/ the libraries it loads into tenants: the
# limiter (inject/, for `tfusion run` and the worker's sessions), the remote client
# (client-inject/, for `tfusion run --remote`) and, where it was built, the device plugin. Each
# inject folder holds links to one copy of its library (a program that opens both libcuda.so and
# libcuda.so.1 gets one limiter, not two). Run it again to upgrade: files are replaced whole.
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
prefix=/usr/local
build=build
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a folder" >&2; exit 2; }; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix is empty" >&2; exit 2; }
for f in src/cli/tfusion src/limiter/inject/libcuda.so.1 src/client/inject/libcuda.so.1; do
  if [ ! -e "$build/$f" ]; then
    echo "install.sh: $build/$f is missing: build first (bash scripts/setup.sh), or name the build folder" >&2
    exit 2
  fi
done

lib=$prefix/lib/tensorfusion
mkdir -p "$prefix/bin" "$lib"
# Copied under a temporary name, then renamed: a running tenant keeps the file it mapped.
put() {  # put SOURCE DEST MODE
  install -m "$3" "$1" "$2.new.$$"
  mv -f "$2.new.$$" "$2"
}
put "$build/src/cli/tfusion" "$prefix/bin/tfusion" 0755

# inject_dir SOURCE_DIR NAME: the links of SOURCE_DIR, each to one installed copy of its target.
inject_dir() {
  local src=$1 dest=$lib/$2 link target base
  mkdir -p "$dest"
  for link in "$src"/*; do
    target=$(readlink -f "$link")
    base=$(basename "$target")
    [ -f "$lib/$base.installed.$$" ] || { put "$target" "$lib/$base" 0755; : > "$lib/$base.installed.$$"; }
    ln -sfn "../$base" "$dest/$(basename "$link")"
  done
}
inject_dir "$build/src/limiter/inject" inject
inject_dir "$build/src/client/inject" client-inject
rm -f "$lib"/*.installed.$$
if [ -f "$build/src/deviceplugin/libtfusion-deviceplugin.so" ]; then
  put "$build/src/deviceplugin/libtfusion-deviceplugin.so" "$lib/libtfusion-deviceplugin.so" 0755
fi

for link in "$lib"/inject/* "$lib"/client-inject/*; do
  [ -e "$link" ] || { echo "install.sh: $link does not resolve" >&2; exit 1; }
done
echo "installed $prefix/bin/tfusion and its libraries in $lib"
