#!/bin/sh
# Container entrypoint: the first argument picks the role, the rest are its flags.
#   namesrv [mqnamesrv flags]       (settings also from TRIMQ_* environment variables)
#   broker  [mqbroker flags]        (PEER_RELAY set: deploy/relay.py runs next to it, see there)
#   controller [mqcontroller flags] (TRIMQ_* settings, controller/config.py; PEER_RELAY too)
#   etcd [etcd flags]               (Debian's etcd-server; ETCD_* variables are its settings)
#   prometheus [prometheus flags]   (Debian's prometheus; PROMETHEUS_CONFIG [/etc/trimq/prometheus.yml])
#   dashboard [mqdashboard flags]   (NAMESRV_ADDR, TRIMQ_DASHBOARD_*; PEER_RELAY too;
#                                   DASHBOARD_SECURE_DIR: TLS files there, login = ACL account)
#   healthcheck namesrv|broker|controller|etcd  (used by the compose health checks)
# Anything else is run as a command (e.g. `sh`).
# SECRETS_ENV_FILE set: its KEY=value lines are exported first (the secured cluster's
# broker account, deploy/docker-compose.secure.yml): secrets kept out of the container's
# configuration reach the server and the health check alike.
set -e
role=${1:-namesrv}
[ "$#" -gt 0 ] && shift

if [ -n "${SECRETS_ENV_FILE:-}" ]; then
    set -a
    . "$SECRETS_ENV_FILE"
    set +a
fi

# A process that must reach peers' advertised (loopback) addresses gets a relay to them; it
# is the server's child after the exec and goes when the container stops.
start_relay() {
    if [ -n "${PEER_RELAY:-}" ]; then
        python3 /opt/trimq/bin/trimq-relay "$PEER_RELAY" &
    fi
}

case "$role" in
    namesrv | mqnamesrv)
        # mqnamesrv listens on loopback by default; in a container it must listen on all.
        TRIMQ_LISTEN=${TRIMQ_LISTEN:-0.0.0.0:9876}
        export TRIMQ_LISTEN
        exec mqnamesrv "$@"
        ;;
    broker | mqbroker)
        start_relay
        exec mqbroker "$@"
        ;;
    controller | mqcontroller)
        TRIMQ_LISTEN=${TRIMQ_LISTEN:-0.0.0.0:9878}
        export TRIMQ_LISTEN
        start_relay
        exec mqcontroller "$@"
        ;;
    etcd)
        # Its data lives in the container's /data volume unless ETCD_DATA_DIR says otherwise.
        ETCD_DATA_DIR=${ETCD_DATA_DIR:-/data/etcd}
        export ETCD_DATA_DIR
        exec etcd "$@"
        ;;
    prometheus)
        # Its time series live in the container's /data volume.
        exec prometheus --config.file="${PROMETHEUS_CONFIG:-/etc/trimq/prometheus.yml}" \
            --storage.tsdb.path=/data/prometheus --web.listen-address=0.0.0.0:9090 "$@"
        ;;
    dashboard | mqdashboard)
        TRIMQ_DASHBOARD_LISTEN=${TRIMQ_DASHBOARD_LISTEN:-0.0.0.0:8080}
        export TRIMQ_DASHBOARD_LISTEN
        if [ -n "${DASHBOARD_SECURE_DIR:-}" ]; then
            # admin.env names the host's paths of these files; here they are mounted there.
            export TRIMQ_TLS_TRUST_CERT_PATH="$DASHBOARD_SECURE_DIR/ca.pem" \
                TRIMQ_TLS_CERT_PATH="$DASHBOARD_SECURE_DIR/client.pem" \
                TRIMQ_TLS_KEY_PATH="$DASHBOARD_SECURE_DIR/client.key"
            export TRIMQ_DASHBOARD_USER="${TRIMQ_DASHBOARD_USER:-${TRIMQ_ACCESS_KEY:-}}" \
                TRIMQ_DASHBOARD_PASSWORD="${TRIMQ_DASHBOARD_PASSWORD:-${TRIMQ_SECRET_KEY:-}}"
        fi
        start_relay
        exec mqdashboard "$@"
        ;;
    healthcheck) exec python3 /opt/trimq/bin/trimq-healthcheck "$@" ;;
    *) exec "$role" "$@" ;;
esac
