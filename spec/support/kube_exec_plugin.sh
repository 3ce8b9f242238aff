#!/bin/sh
# A kubeconfig exec plugin for the kubernetes specs: counts its runs in $FAKE_EXEC_DIR/exec-runs
# (and appends a line per run to exec-starts, which runs at the same time cannot lose),
# keeps what it was given in KUBERNETES_EXEC_INFO, and answers an ExecCredential of the
# apiVersion it was asked for whose token is exec-token-<run> (expiring at $FAKE_EXEC_EXPIRES
# when that is set). With $FAKE_EXEC_FAIL set it says so on stderr and exits 1; with
# $FAKE_EXEC_FLOOD it writes that many bytes instead; with $FAKE_EXEC_SLEEP it sleeps first; with
# $FAKE_EXEC_HOLD it answers only once that file exists (or $FAKE_EXEC_DIR is gone); with
# $FAKE_EXEC_STATUS its status is that JSON text.
set -eu
dir=$FAKE_EXEC_DIR
n=$(( $(cat "$dir/exec-runs" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$dir/exec-runs"
echo start >>"$dir/exec-starts"
printf '%s\n' "$KUBERNETES_EXEC_INFO" >"$dir/exec-info"
if [ -n "${FAKE_EXEC_SLEEP:-}" ]; then
	sleep "$FAKE_EXEC_SLEEP"
fi
if [ -n "${FAKE_EXEC_HOLD:-}" ]; then
	# Bounded by the cluster's life too: a spec that failed before writing the file removes the
	# directory as it stops the cluster.
	while [ ! -e "$FAKE_EXEC_HOLD" ] && [ -d "$dir" ]; do sleep 0.01; done
fi
if [ -n "${FAKE_EXEC_FLOOD:-}" ]; then
	head -c "$FAKE_EXEC_FLOOD" /dev/zero | tr '\0' x
	exit 0
fi
if [ -n "${FAKE_EXEC_FAIL:-}" ]; then
	echo "$FAKE_EXEC_FAIL" >&2
	exit 1
fi
api=$(printf '%s' "$KUBERNETES_EXEC_INFO" | sed 's/.*"apiVersion" *: *"\([^"]*\)".*/\1/')
if [ -n "${FAKE_EXEC_STATUS:-}" ]; then
	printf '{"apiVersion":"%s","kind":"ExecCredential","status":%s}\n' "$api" "$FAKE_EXEC_STATUS"
	exit 0
fi
expiry=""
if [ -n "${FAKE_EXEC_EXPIRES:-}" ]; then
	expiry=",\"expirationTimestamp\":\"$FAKE_EXEC_EXPIRES\""
fi
printf '{"apiVersion":"%s","kind":"ExecCredential","status":{"token":"exec-token-%s"%s}}\n' "$api" "$n" "$expiry"
