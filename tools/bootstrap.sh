#!/bin/sh
# Installs the Debian packages of one set, when any is missing; a no-op once all are there.
#   sh tools/bootstrap.sh demo      what `make demo` needs: build sandkit, run a local session
#   sh tools/bootstrap.sh [check]   what `make check` needs besides: the test tools and everything
#                                   the specs start (the default)
#   sh tools/bootstrap.sh bench     what `make bench` needs besides: the peers it measures against
#   sh tools/bootstrap.sh --list SET   prints the set's packages, one a line, and installs nothing
set -eu

# The build (a C compiler, the Lua 5.4 headers, libcurl, OpenSSL, libevent, libarchive) and
# lua-cjson, which sandkit needs at run time. bubblewrap builds each confined local session; passt
# (pasta) and slirp4netns give one an outbound network, set up with iproute2.
demo="make gcc pkg-config lua5.4 liblua5.4-dev lua-cjson libcurl4-openssl-dev libssl-dev libevent-dev
libarchive-dev bubblewrap passt slirp4netns iproute2"
# busted and luacheck run the suite and the lint. nginx with its Lua module and lua-resty-core
# runs the nginx specs and examples/openresty, on the C module built for LuaJIT (luajit2 and its
# headers); chromium loads that example's pages in its end-to-end specs, the terminal page over
# lua-nginx-websocket, driven through python3-websocket (its xterm.js comes from npm, which the
# example's setup.sh runs: Node's own packages bring it). lua-yaml reads
# kubeconfigs, and python3-kubernetes and python3-cryptography referee the Kubernetes specs.
# lua5.1 and its headers are what `luarocks --lua-version=5.1` builds an OpenResty install with;
# the packaging spec takes that path, and packs its source rock with zip. The specs' fakes and
# clients use LuaSocket, cqueues, curl, openssl and procps. busybox-static is the whole system
# of the images the image specs import; mmdebstrap builds the one image they build.
check="$demo lua-busted lua-check lua-socket lua-cqueues luarocks luajit2 libluajit2-5.1-dev nginx
libnginx-mod-http-lua lua-resty-core lua-nginx-websocket chromium python3-websocket curl openssl procps
lua-yaml python3-kubernetes python3-cryptography lua5.1 liblua5.1-0-dev zip busybox-static mmdebstrap
e2fsprogs fuse-overlayfs"
bench="$check python3 nodejs valgrind"

list=""
if [ "${1:-}" = "--list" ]; then
	list=yes
	shift
fi
case "${1:-check}" in
demo) packages=$demo ;;
check) packages=$check ;;
bench) packages=$bench ;;
*)
	echo "sandkit: bootstrap takes [--list] demo, check or bench, not: $1" >&2
	exit 2
	;;
esac

if [ -n "$list" ]; then
	for p in $packages; do echo "$p"; done
	exit 0
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
