#!/bin/sh
# fetch-debs.sh - downloads, on a machine with a Debian package registry,
# the .deb files that tests/gpu/run.sh unpacks on the GPU machine (whose
# image has nvcc and CMake but not these libraries, and no registry):
# Jansson, PCRE2, utf8proc, Criterion and libmicrohttpd with their runtime
# dependencies, and pkgconf.  They land in gpu-debs/ at the repository root
# (git-ignored); the device call carries that folder.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/gpu-debs"
cd "$root/gpu-debs"
pkgs="libjansson4 libjansson-dev
libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libpcre2-dev
libutf8proc2 libutf8proc-dev
libcriterion3 libcriterion-dev libgit2-1.5 libnanomsg5 libffi8 libhttp-parser2.9
libmbedcrypto7 libmbedtls14 libmbedx509-1 libssh2-1
libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
libmicrohttpd12 libmicrohttpd-dev
pkgconf pkgconf-bin libpkgconf3"
# shellcheck disable=SC2086
apt-get download $pkgs
ls -1 "$root/gpu-debs"
