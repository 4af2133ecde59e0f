#!/bin/sh
# Container entrypoint: the first argument picks the role, the rest are its flags.
#   namesrv [mqnamesrv flags]   (settings also from TRIMQ_* environment variables)
#   broker  [mqbroker flags]
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
    broker | mqbroker) exec mqbroker "$@" ;;
    healthcheck) exec python3 /opt/trimq/bin/trimq-healthcheck "$@" ;;
    *) exec "$role" "$@" ;;
esac
