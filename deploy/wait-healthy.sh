#!/usr/bin/env bash
# wait-healthy.sh PROJECT [SECONDS]: wait until every container of the compose project is
# healthy; print the unhealthy ones and their last health output on timeout.
set -euo pipefail
project=${1:?compose project name}
limit=${2:-120}
deadline=$((SECONDS + limit))
while :; do
    ids=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
    if [ -n "$ids" ]; then
        bad=$(docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' $ids |
            awk '$2 != "healthy"')
        if [ -z "$bad" ]; then
            echo "all $(echo "$ids" | wc -l) containers of $project are healthy"
            exit 0
        fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "timed out after ${limit}s; not healthy:" >&2
        echo "${bad:-no containers}" >&2
        for id in $ids; do
            docker inspect -f '{{.Name}}: {{if .State.Health}}{{range .State.Health.Log}}{{.Output}}{{end}}{{end}}' "$id" >&2
        done
        exit 1
    fi
    sleep 1
done
