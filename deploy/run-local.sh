#!/usr/bin/env bash
# `make run`: one NameServer and one broker on loopback, logs to this terminal.
# Ctrl-C (SIGINT) stops the broker first (it unregisters and flushes), then the NameServer.
set -u
BIN=${BIN:-.venv/bin}
NAMESRV_ADDR=${NAMESRV_ADDR:-127.0.0.1:9876}
BROKER_LISTEN=${BROKER_LISTEN:-127.0.0.1:10911}
STORE_DIR=${STORE_DIR:-./.trimq}

# A terminal's Ctrl-C signals its whole foreground process group. With job control on, each
# process below gets a process group of its own, so only this script hears Ctrl-C and `stop`
# sets the order; without it the NameServer could stop before the broker unregistered.
set -m
"$BIN/mqnamesrv" --listen "$NAMESRV_ADDR" &
ns=$!
sleep 0.5
"$BIN/mqbroker" -n "$NAMESRV_ADDR" --listen "$BROKER_LISTEN" --store-dir "$STORE_DIR" &
br=$!

stop() {
    trap '' INT TERM
    kill -TERM "$br" 2>/dev/null; wait "$br" 2>/dev/null
    kill -TERM "$ns" 2>/dev/null; wait "$ns" 2>/dev/null
    exit 0
}
trap stop INT TERM HUP
# Either process exiting on its own ends the session too.
wait -n "$ns" "$br"
rc=$?
echo "trimq: a process exited (status $rc); stopping the other" >&2
kill -TERM "$br" "$ns" 2>/dev/null; wait
exit "$rc"
