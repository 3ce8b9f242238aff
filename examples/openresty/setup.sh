#!/bin/sh
# Installs what the terminal page needs beside this directory: xterm.js from npm, at the version
# the page was written for. run.sh calls it when node_modules/@xterm/xterm is missing.
set -eu
cd "$(dirname "$0")"
npm install --no-audit --no-fund --no-save --prefix . @xterm/xterm@6.0.0 >&2
