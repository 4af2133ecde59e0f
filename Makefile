# trimq developer commands. `make test` and `make run` work from a fresh clone:
# each (re)creates .venv when it is missing or older than pyproject.toml.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.stamp-run
TEST_STAMP := $(VENV)/.stamp-test
BENCH_STAMP := $(VENV)/.stamp-bench

NAMESRV_ADDR ?= 127.0.0.1:9876
BROKER_LISTEN ?= 127.0.0.1:10911
STORE_DIR ?= ./.trimq

.PHONY: run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The C accelerators (common/speedups.c, common/acl_native.c, remoting/_speedups.c) are built
# in place by the editable install: a changed .c file reinstalls too.
NATIVE_SOURCES := $(wildcard common/speedups.c common/acl_native.c remoting/_speedups.c)

$(RUN_STAMP): pyproject.toml $(NATIVE_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(NATIVE_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,compat]'
	touch $@ $(RUN_STAMP)

# One NameServer and one broker on loopback; Ctrl-C stops both cleanly.
run: $(RUN_STAMP)
	@BIN=$(BIN) NAMESRV_ADDR=$(NAMESRV_ADDR) BROKER_LISTEN=$(BROKER_LISTEN) STORE_DIR=$(STORE_DIR) deploy/run-local.sh

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check common namesrv broker remoting store client controller dashboard tests bench deploy
	$(BIN)/mypy

# The controller's consensus engine for its tests: Debian's etcd (3.4), installed when
# missing; its systemd unit is disabled again (the tests start their own on free ports).
.PHONY: etcd-install
etcd-install:
	@if ! command -v etcd >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; \
		(systemctl disable --now etcd >/dev/null 2>&1 || true); \
	fi

# The whole suite, then again on the pure-Python code (TRIMQ_NO_NATIVE=1) what the accelerators
# replace: frame/header and record codecs, hashes, ids, fsync (common, store, remoting) and their
# callers end to end (client send/pull decoding, broker batches and filters, send/pull/recovery
# over real processes); the native_* equivalence tests already compare both in the first pass.
NO_NATIVE_TESTS := tests/unit/common tests/unit/store tests/unit/remoting \
	$(addprefix tests/unit/client/test_,pull_body_decoding.py batch_encoding.py \
		send_wire_bytes.py message.py producer.py spark_arrow.py) \
	$(addprefix tests/unit/broker/test_,batch_stored_properties.py stored_properties_text.py \
		filter_and_long_polling.py commit_runs.py) \
	$(addprefix tests/integration/test_,native_interop.py broker_send_path.py inline_broker.py \
		remoting_loopback.py remoting_negotiation.py header_ranges.py json_only_servers.py \
		broker_process.py client_produce_consume.py store_kill.py store_damage.py)

# The dashboard's browser tests (tests/integration/test_dashboard*.py): Debian's chromium, which
# Playwright drives (its own browser download is never used), and Debian's Chart.js, which
# mqdashboard serves for its live charts; installed when missing.
.PHONY: browser-install
browser-install:
	@if ! command -v chromium >/dev/null || [ ! -f /usr/share/javascript/chart.js/chart.min.js ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libjs-chart.js; \
	fi

# Two pytest-xdist workers for everything but the docker cluster (a module's tests, and all of
# Spark's, stay in one worker: tests/conftest.py; each worker draws ports from its own range:
# tests/helpers.free_port), then the cluster scenarios alone: they measure recovery under load
# and their compose projects must not overlap. Every pass runs; make fails if any did.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadgroup

test: lint etcd-install browser-install
	@status=0; \
	$(BIN)/python -m pytest $(XDIST) -m "not cluster" || status=1; \
	$(BIN)/python -m pytest tests/cluster || status=1; \
	TRIMQ_NO_NATIVE=1 $(BIN)/python -m pytest $(XDIST) --ignore-glob='tests/unit/*/test_native_*' \
		$(NO_NATIVE_TESTS) || status=1; \
	exit $$status

unit: $(TEST_STAMP)
	$(BIN)/python -m pytest -m unit

$(BENCH_STAMP): pyproject.toml | $(TEST_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	touch $@

# The peers (Debian's nats-server and redis-server) are installed when missing; apt enables
# their systemd units, which are disabled again: bench/peers starts its own instances.
.PHONY: bench-peers-install
bench-peers-install:
	@if ! command -v nats-server >/dev/null || ! command -v redis-server >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server redis-server; \
		(systemctl disable --now nats-server redis-server >/dev/null 2>&1 || true); \
	fi

# Quick mode (< 2 minutes for the peers harness) unless FULL=1.
BENCH_MODE := $(if $(FULL),,--quick)

bench: $(BENCH_STAMP) bench-peers-install
	$(BIN)/python bench/remoting_rtt.py $(BENCH_MODE)
	$(BIN)/python bench/store_append.py $(BENCH_MODE)
	$(BIN)/python bench/broker_send_pull.py $(BENCH_MODE)
	$(BIN)/python -m bench.peers $(BENCH_MODE)

# The same-protocol peer: rocketmq-rust (crates.io rocketmq-namesrv, rocketmq-broker), built
# once into .bench/rmqrs (about 20-25 minutes on 2 cores); bench/peers skips it when not built.
# One target directory for both crates (their dependencies are built once), removed after.
# The broker is installed last: its binary marks both as installed.
RMQRS_VERSION ?= 1.0.0
RMQRS_ROOT    ?= .bench/rmqrs
RMQRS_JOBS    ?= 2

.PHONY: bench-rmqrs
bench-rmqrs: $(RMQRS_ROOT)/bin/rocketmq-broker-rust

$(RMQRS_ROOT)/bin/rocketmq-broker-rust:
	CARGO_TARGET_DIR=$(RMQRS_ROOT)/target cargo install --locked -j $(RMQRS_JOBS) \
		--root $(RMQRS_ROOT) rocketmq-namesrv@$(RMQRS_VERSION) rocketmq-broker@$(RMQRS_VERSION)
	rm -rf $(RMQRS_ROOT)/target

clean:
	rm -rf $(VENV) .trimq .pytest_cache .mypy_cache .ruff_cache build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- container image and docker-compose cluster (deploy/) ---------------------------------
# `make image` builds trimq:latest with no registry: wheels built here, a local Debian base
# image when python:3.11-slim is not present (see deploy/build-image.sh).
IMAGE        ?= trimq:latest
BASE_IMAGE   ?= python:3.11-slim
LOCAL_BASE   ?= trimq-base:bookworm
WHEELS       := deploy/wheels
WHEEL_STAMP  := $(WHEELS)/.stamp
APP_SOURCES  := $(shell find common namesrv broker remoting store client controller dashboard -name '*.py' -o -name '*.c' -o -name '*.pyi' 2>/dev/null)
# Debian's etcd-server for the image's `etcd` role and Debian's prometheus for its `prometheus`
# role, with the packages they depend on that a minimal base may lack (the Dockerfile installs
# the missing ones): fetched with this host's apt. The stamp names the set, so a new set is
# fetched again.
DEBS         := deploy/debs
DEBS_STAMP   := $(DEBS)/.stamp-etcd-prometheus-chartjs
ETCD_DEBS    := etcd-server adduser init-system-helpers
PROMETHEUS_DEBS := prometheus fonts-glyphicons-halflings javascript-common libjs-bootstrap \
	libjs-bootstrap4 libjs-popper.js libjs-d3 libjs-eonasdan-bootstrap-datetimepicker \
	libjs-jquery libjs-jquery-hotkeys libjs-moment libjs-moment-timezone libjs-mustache \
	libjs-rickshaw
# Debian's Chart.js for mqdashboard's live charts (the image's `dashboard` role).
DASHBOARD_DEBS := libjs-chart.js
IMAGE_DEBS   := $(ETCD_DEBS) $(PROMETHEUS_DEBS) $(DASHBOARD_DEBS)
CLUSTER_PROJECT ?= trimq
COMPOSE      ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
# SECURE=1: the secured variant (deploy/docker-compose.secure.yml over the base file: ACL and
# TLS enforcing). Its CA, certificates, ACL accounts and secrets are made by
# deploy/make_secure.py into SECURE_DIR (gitignored; random secrets, kept while the project
# lives, removed by cluster-down). SECURE_TOPICS/SECURE_GROUPS: what the application account
# (app.env) may use.
SECURE       ?=
SECURE_ON    := $(filter 1 true yes,$(SECURE))
SECURE_DIR   ?= $(CURDIR)/deploy/secure/$(CLUSTER_PROJECT)
SECURE_TOPICS ?= TopicTest
SECURE_GROUPS ?= cg_test
CLUSTER_FILES := -f deploy/docker-compose.yml $(if $(SECURE_ON),-f deploy/docker-compose.secure.yml)
# The `dashboard` profile: mqdashboard on 127.0.0.1:8080 (DASHBOARD_PORT; the failover tests' own
# projects leave it off).
CLUSTER      := $(if $(SECURE_ON),SECURE_DIR=$(SECURE_DIR)) $(COMPOSE) -p $(CLUSTER_PROJECT) $(CLUSTER_FILES) \
	--profile dashboard
CONTROLLER_PROJECT ?= trimq-ctl
CONTROLLER_CLUSTER := $(COMPOSE) -p $(CONTROLLER_PROJECT) -f deploy/docker-compose.controller.yml

.PHONY: image cluster-up cluster-down cluster-test cluster-controller-up cluster-controller-down \
	cluster-secure-files

# Wheels for trimq and its runtime dependencies (with the `dashboard` extra's, for mqdashboard);
# trimq's own wheel goes to app/ so the image's dependency layer stays cached while only trimq
# changes.
$(WHEEL_STAMP): pyproject.toml README.md $(APP_SOURCES) | $(RUN_STAMP)
	rm -rf $(WHEELS)/deps $(WHEELS)/app
	mkdir -p $(WHEELS)/deps $(WHEELS)/app
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check '.[dashboard]' -w $(WHEELS)/deps
	mv $(WHEELS)/deps/trimq-*.whl $(WHEELS)/app/
	touch $@

$(DEBS_STAMP):
	rm -rf $(DEBS)
	mkdir -p $(DEBS)
	cd $(DEBS) && { apt-get download $(IMAGE_DEBS) 2>/dev/null || \
		{ apt-get update -qq && apt-get download $(IMAGE_DEBS); }; }
	touch $@

image: $(WHEEL_STAMP) $(DEBS_STAMP)
	IMAGE=$(IMAGE) BASE=$(BASE_IMAGE) LOCAL_BASE=$(LOCAL_BASE) deploy/build-image.sh

# Two NameServers (127.0.0.1:9876, :9877), masters broker-a/b/c (127.0.0.1:10911, :10921, :10931;
# HA ports :10912, :10922, :10932) and their slaves (:10915, :10925, :10935). BROKER_ROLE=SYNC_MASTER
# makes the masters wait for their slaves (default ASYNC_MASTER; deploy/docker-compose.yml),
# Prometheus (http://127.0.0.1:9090/) and mqdashboard (http://127.0.0.1:8080/).
# SECURE=1: the same with ACL and TLS; clients: `set -a; . deploy/secure/trimq/admin.env; set +a`.
cluster-up: image $(if $(SECURE_ON),cluster-secure-files)
	TRIMQ_IMAGE=$(IMAGE) $(CLUSTER) up -d
	deploy/wait-healthy.sh $(CLUSTER_PROJECT) 120

cluster-down:
	$(CLUSTER) down -v --remove-orphans
	$(if $(SECURE_ON),rm -rf $(SECURE_DIR))

# Kept when present: a running cluster's brokers hold the keys they started with.
cluster-secure-files: $(TEST_STAMP)
	$(BIN)/python deploy/make_secure.py $(SECURE_DIR) \
		$(addprefix --topic ,$(SECURE_TOPICS)) $(addprefix --group ,$(SECURE_GROUPS))

# Controller mode: a 3-member etcd, controllers on 127.0.0.1:9978-9980, a NameServer on :9976,
# broker-a's two controller-mode replicas (:11011, :11021; the controllers pick the master) and
# a plain broker-b (:11031); deploy/docker-compose.controller.yml. A project of its own.
cluster-controller-up: image
	TRIMQ_IMAGE=$(IMAGE) $(CONTROLLER_CLUSTER) up -d
	deploy/wait-healthy.sh $(CONTROLLER_PROJECT) 180

cluster-controller-down:
	$(CONTROLLER_CLUSTER) down -v --remove-orphans

# The failover scenarios against their own compose projects (trimq-sec-test-<pid>, the secured
# variant, first; trimq-ctl-test-<pid> for the controller-mode ones; then trimq-test-<pid> with
# SYNC_MASTER; ports picked free, secured material made per run in a temporary directory);
# K=<expression> runs the matching ones only (pytest -k), e.g. K=controller; SECURE=1 the
# secured ones only (tests/cluster/test_acl_tls_failover.py).
cluster-test: image $(TEST_STAMP)
	$(BIN)/python -m pytest -m cluster -s \
		$(if $(SECURE_ON),tests/cluster/test_acl_tls_failover.py,tests/cluster) $(if $(K),-k "$(K)")
