#!/bin/sh
# Runs the OpenResty example: builds sandkit (the C module for LuaJIT, sandkit-agent), then
# starts nginx with examples/openresty/nginx.conf, sessions under a fresh directory.
#   sh examples/openresty/run.sh            # from anywhere; PORT=8080 by default
# It prints the page's address with the gateway's token. Ctrl-C stops nginx, stops every
# session's agent (and so its commands) and removes the directory.
set -eu
checkout=$(cd "$(dirname "$0")/../.." && pwd)
cd "$checkout"
build=${BUILD:-build}
if [ -z "${SANDKIT_NO_BUILD:-}" ]; then
	make -s all BUILD="$build" >&2
fi
build=$(cd "$build" && pwd)
# The terminal page's xterm.js (npm's @xterm/xterm), installed once.
[ -f examples/openresty/node_modules/@xterm/xterm/lib/xterm.js ] || sh examples/openresty/setup.sh
port=${PORT:-8080}
state=$(mktemp -d)
mkdir -p "$state/temp"
export SANDKIT_AGENT="${SANDKIT_AGENT:-$build/sandkit-agent}"
export SANDKIT_STATE="$state/sandkit"
export SANDKIT_GATEWAY_TOKEN="${SANDKIT_GATEWAY_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
# A master running as root hands its workers to `nobody`, who could not use $state.
user=""
[ "$(id -u)" = 0 ] && user="user root root;"
sed -e "s|@CHECKOUT@|$checkout|g" -e "s|@BUILD@|$build|g" -e "s|@STATE@|$state|g" \
	-e "s|@PORT@|$port|g" -e "s|@USER@|$user|g" examples/openresty/nginx.conf >"$state/nginx.conf"

nginx_pid=""
cleanup() {
	trap - EXIT INT TERM
	if [ -n "$nginx_pid" ]; then
		kill "$nginx_pid" 2>/dev/null || true
		wait "$nginx_pid" 2>/dev/null || true
	fi
	# Each session's record names its agent; SIGTERM makes an agent kill its commands first.
	for record in "$state"/sandkit/sessions/*/record.json; do
		[ -f "$record" ] || continue
		pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$record")
		[ -n "$pid" ] && kill "$pid" 2>/dev/null || true
	done
	rm -rf "$state"
}
trap cleanup EXIT INT TERM

nginx -p "$state" -c "$state/nginx.conf" -g 'daemon off;' &
nginx_pid=$!
echo "open http://127.0.0.1:$port/#token=$SANDKIT_GATEWAY_TOKEN" >&2
wait "$nginx_pid"
