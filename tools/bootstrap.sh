#!/bin/sh
# Installs the Debian packages sandkit builds, tests and runs with, when any is missing.
# Run by `make check` and `make demo`, and with `bench` by `make bench` (which also needs the
# peers it measures against); a no-op once everything is there.
set -eu

# nginx with its Lua module and lua-resty-core runs the nginx specs and examples/openresty;
# chromium loads that example's page in its end-to-end spec. lua-yaml reads kubeconfigs, and
# python3-kubernetes and python3-cryptography referee the Kubernetes specs. lua5.1 and its
# headers are what `luarocks --lua-version=5.1` builds an OpenResty install with; the packaging
# spec takes that path, and packs its source rock with zip.
packages="make gcc pkg-config lua5.4 liblua5.4-dev lua-cjson lua-busted lua-check lua-socket lua-cqueues
libcurl4-openssl-dev libssl-dev libevent-dev luarocks luajit2 libluajit2-5.1-dev nginx
libnginx-mod-http-lua lua-resty-core chromium bubblewrap curl openssl procps lua-yaml python3-kubernetes
python3-cryptography lua5.1 liblua5.1-0-dev zip"
if [ "${1:-}" = "bench" ]; then
	packages="$packages python3 nodejs valgrind"
fi

# One dpkg-query for every package (one each took seconds on a busy machine); a package it
# does not list as installed, or does not know, is missing.
installed=" $(dpkg-query -W -f='${Package}:${Status}\n' $packages 2>/dev/null \
	| sed -n 's/:install ok installed$//p' | tr '\n' ' ')"
missing=""
for p in $packages; do
	case "$installed" in
	*" $p "*) ;;
	*) missing="$missing $p" ;;
	esac
done
[ -z "$missing" ] && exit 0

echo "sandkit: installing missing Debian packages:$missing" >&2
if [ "$(id -u)" -eq 0 ]; then
	sudo=""
elif command -v sudo >/dev/null 2>&1; then
	sudo="sudo"
else
	echo "sandkit: need root (or sudo) to install:$missing" >&2
	exit 1
fi
# A stale package list makes apt-get miss packages that exist; refresh it once per bootstrap.
$sudo apt-get update -qq
# --no-remove: a package that conflicts with one already here (Debian's two LuaJITs, say) stops
# the install with apt's reason instead of silently uninstalling what the machine relies on.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends --no-remove $missing >/dev/null
