# The two commands of the README, and a few helpers.
SHELL := /bin/bash
.PHONY: dev test test-cluster crds rbac image fuzz bench deps docs faults console-page

deps:
	scripts/install-deps.sh

## Install what is needed, build the built-in components, then run banlieue dev
## (embedded API server + CRDs + every role + the libvirt class on test:///default,
## the vSphere and Proxmox VE simulators and libvirtd + qemu, with a Provider each).
## Needs root for libvirtd; tests/backends/libvirtd/stop.sh stops it afterwards.
dev: deps
	guests/build.sh
	scripts/console-page.sh
	cargo run -p banlieue -- dev --backends vsphere,proxmox,libvirt

## Install what is needed, then run every test.
test:
	scripts/test.sh

## The end-to-end suites against the cluster of KUBECONFIG (any cluster; CI runs them on a
## real kube-apiserver v1.24 after `make test`, whose build they reuse), or only SUITES="a b".
## What a run adds to the cluster is removed afterwards. Needs root for libvirtd, as `make test`.
test-cluster:
	scripts/test-cluster-suites.sh "$(KUBECONFIG)" $(SUITES)

## Regenerate deploy/crds from the API types.
crds:
	cargo run -q -p banlieue -- crdgen

## Regenerate deploy/base/rbac.yaml from the permissions each role declares.
rbac:
	cargo run -q -p banlieue -- rbacgen

## The browser console page into target/console-page (what --console-page-dir serves):
## console-page/ with xterm.js and noVNC from npm, at the versions its package-lock.json pins.
console-page:
	scripts/console-page.sh

## The container image (buildah): banlieue:<version> and banlieue:<git commit>.
## PUSH=host:port also pushes both tags there (see deploy/overlays/local-registry).
image:
	guests/build.sh
	scripts/image.sh

## Benchmarks (figures go in BENCHMARKS.md).
bench:
	cargo bench -p banlieue-apiserver --bench apiserver
	guests/build.sh && cargo bench -p banlieue-runtime --bench runtime
	cargo bench -p banlieue-tests --bench control_loop
	cargo bench -p banlieue-tests --bench observability
	cargo bench -p banlieue-tests --bench real_cluster
	cargo bench -p banlieue-tests --bench sharding
	cargo bench -p banlieue-tests --bench providers
	cargo bench -p banlieue-tests --bench libvirtd
	cargo bench -p banlieue-tests --bench conformance
	cargo bench -p banlieue-tests --bench placement
	cargo bench -p banlieue-tests --bench pools
	cargo build --release -p banlieue && cargo bench -p banlieue-tests --bench bootstrap
	cargo bench -p banlieue-tests --bench throttle
	cargo bench -p banlieue-tests --bench capi
	cargo bench -p banlieue-imagebuilder --bench fetch
	cargo bench -p banlieue-secrets --bench credentials
	cargo bench -p banlieue-tests --bench images

## The fault suites at their full iteration counts (CI runs shorter ones); every suite
## prints a `RELIABILITY …` line: the figures of BENCHMARKS.md's "Reliability".
## BANLIEUE_FAULTS_SEED=N replays a run of the seeded suites.
FAULT_SUITES = faults_api faults_hosts faults_backends faults_drivers
faults:
	guests/build.sh
	mkdir -p target
	cargo build -p banlieue
	set -o pipefail; for t in $(FAULT_SUITES); do BANLIEUE_FAULTS_FULL=1 cargo test -p banlieue-tests --test $$t -- --nocapture --test-threads 1 || exit 1; done 2>&1 | tee target/faults.log
	@grep -h 'RELIABILITY' target/faults.log

## Fuzz every target for FUZZ_SECONDS each (needs the nightly toolchain and cargo-fuzz).
FUZZ_SECONDS ?= 60
fuzz:
	cd fuzz && for t in $$(cargo +nightly fuzz list); do cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; done

## The documentation site: docs/reference/api.md from deploy/crds, then docs/ built
## into target/site (strict: a broken link or anchor fails).
docs:
	@command -v mkdocs >/dev/null 2>&1 || pip install --break-system-packages -q 'mkdocs>=1.6,<2'
	python3 scripts/apidocs.py
	mkdocs build --strict --site-dir target/site
	@echo "site: $(CURDIR)/target/site/index.html"
