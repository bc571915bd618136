# `make run` and `make test` do all set-up on a fresh machine: they create .venv and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Reinstall whenever the package metadata changes.
INSTALLED := $(VENV)/.installed

.PHONY: run test deep lint bench clean haproxy redis etcd zookeeper cluster chromium

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[node,test]'
	touch $@

run: $(INSTALLED)
	$(BIN)/sluicegate-node -c deploy/example.toml --address 127.0.0.1 --port 8000

# Three nodes and HAProxy on loopback, until Ctrl-C.
cluster: $(INSTALLED) haproxy
	$(BIN)/python deploy/local_cluster.py

test: $(INSTALLED) haproxy chromium
	$(BIN)/python -m pytest

# deep: every seed that ever failed (simulations/regressions*.txt, about ten minutes), then a long
# simulation sweep (about four hours on 2 cores): 3,000 seeds of three nodes and 1,000 of five,
# in two processes, with the availability probe and every fault kind (clock skew, mid-write
# freezes and overlapping bursts included), from a random first seed that it prints first.
# Fails if any seed fails, and prints how to replay each. Options go through DEEP_ARGS:
# `make deep DEEP_ARGS="--first 123456789"` runs a sweep again, "--with ''" leaves the extra
# fault kinds out, "--three 300 --five 100" makes a shorter sweep.
deep: $(INSTALLED)
	$(BIN)/python -m simulations replay --jobs 2
	$(BIN)/python -m simulations deep --jobs 2 $(DEEP_ARGS)

# $(call debian,COMMAND,PACKAGE): install Debian's PACKAGE if COMMAND is not found (as root, else
# through sudo). Debian puts some commands in /usr/sbin.
define debian
	@PATH="$$PATH:/usr/sbin:/usr/local/sbin"; command -v $(1) >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	    echo "$(1) is missing; installing it needs root or sudo: apt-get install $(2)" >&2; \
	    exit 1; fi; \
	  echo "Installing $(2) (Debian package)"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; }
endef

# tests/process/test_haproxy.py runs deploy/haproxy.cfg and fails without HAProxy. `run` needs none.
haproxy:
	$(call debian,haproxy,haproxy)

# tests/process/test_status_page.py opens the status page in headless Chromium, and fails without it in CI
# (it skips elsewhere).
chromium:
	$(call debian,/usr/bin/chromium,chromium)

# mypy reads the packages under their installed names (sluicegate.cluster, ...), which live in
# folders of other names here: .typecheck/sluicegate links to them.
lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p .typecheck/sluicegate
	@for package in cluster node client; do ln -sfn ../../$$package .typecheck/sluicegate/$$package; done
	MYPYPATH=.typecheck $(BIN)/python -m mypy -p sluicegate.cluster -p sluicegate.node -p sluicegate.client

bench: $(INSTALLED) redis etcd zookeeper
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/http_semaphores.py
	$(BIN)/python bench/forwarding.py
	$(BIN)/python bench/ws_semaphores.py
	$(BIN)/python bench/client_path.py
	PATH="$$PATH:/usr/sbin" $(BIN)/python bench/rate_limits.py
	$(BIN)/python bench/gossip_overshoot.py
	$(BIN)/python bench/abuse.py
	$(BIN)/python bench/websocket_framing.py
	$(BIN)/python bench/link_codec.py
	$(BIN)/python bench/cold_start.py
	$(BIN)/python bench/cluster_of_one.py
	$(BIN)/python bench/cluster_vs_peers.py

# bench/rate_limits.py compares with Redis (Debian's package; the bench starts its own server on
# a free loopback port). Installed as root, else through sudo. Tests do not need it.
redis:
	$(call debian,redis-server,redis-server)

# bench/cluster_vs_peers.py compares our cluster with etcd and ZooKeeper (Debian's packages; the
# bench starts three members of each on free loopback ports, and no service of theirs).
etcd:
	$(call debian,etcd,etcd-server)

zookeeper:
	$(call debian,/usr/share/zookeeper/bin/zkServer.sh,zookeeper)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
