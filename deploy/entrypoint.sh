#!/bin/sh
# Container entrypoint: the first argument picks the role, the rest are its flags.
#   namesrv [mqnamesrv flags]   (settings also from TRIMQ_* environment variables)
#   broker  [mqbroker flags]    (PEER_RELAY set: deploy/relay.py runs next to it, see there)
#   healthcheck namesrv|broker  (used by the compose health checks)
# Anything else is run as a command (e.g. `sh`).
set -e
role=${1:-namesrv}
[ "$#" -gt 0 ] && shift
case "$role" in
    namesrv | mqnamesrv)
        # mqnamesrv listens on loopback by default; in a container it must listen on all.
        TRIMQ_LISTEN=${TRIMQ_LISTEN:-0.0.0.0:9876}
        export TRIMQ_LISTEN
        exec mqnamesrv "$@"
        ;;
    broker | mqbroker)
        # A broker reaches its group peer's advertised (loopback) address through the relay;
        # it is the broker's child after the exec and goes when the container stops.
        if [ -n "${PEER_RELAY:-}" ]; then
            python3 /opt/trimq/bin/trimq-relay "$PEER_RELAY" &
        fi
        exec mqbroker "$@"
        ;;
    healthcheck) exec python3 /opt/trimq/bin/trimq-healthcheck "$@" ;;
    *) exec "$role" "$@" ;;
esac
