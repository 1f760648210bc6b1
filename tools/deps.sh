#!/bin/sh
# Installs the Debian packages moerun needs to build and test, when missing.
set -e
# g++ (C++20, 11 or later) and perl: tools/cuda-emu (build.sh, rewrite.pl);
# libopenmpi-dev and openmpi-bin: expert parallelism (runtime/comm) and its tests;
# python3-jsonschema: tests/test_json_schema_engine.c checks sampled outputs with it
PKGS="build-essential g++ perl cmake pkg-config libjansson-dev libcriterion-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin curl python3 python3-pip python3-jsonschema"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
