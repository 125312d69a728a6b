# agentboot: `make run` starts everything locally, `make test` runs every test
# that needs no root, `make e2e` runs the VM lab (root).

SHELL := /bin/bash
.DEFAULT_GOAL := build

# Heavy tools are built once per version into this cache, outside the clone,
# so that a fresh clone on the same machine (CI) reuses them.
AGENTBOOT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/agentboot
export AGENTBOOT_CACHE

BIN            := $(CURDIR)/bin
TESTBIN        := $(BIN)/testbin
# The tree is dirty for the version when anything but the image pin make
# image writes into deploy/kustomization.yaml differs from the commit.
VERSION        ?= $(shell v=$$(git describe --tags --always 2>/dev/null) || { echo dev; exit; }; git diff --quiet HEAD -- . ':(exclude)deploy/kustomization.yaml' || v=$$v-dirty; echo $$v)
CONTROLLER_GEN := $(BIN)/controller-gen
GO_TEST_FLAGS  ?=

# The control-plane binaries envtest and `agentboot dev` use.
export KUBEBUILDER_ASSETS := $(TESTBIN)

.PHONY: build
build: ## bin/agentboot (server components), bin/agent and bin/agent-arm64 (static on-host agent for x86_64 and aarch64 hosts)
	CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN)/agentboot ./cmd/agentboot
	CGO_ENABLED=0 GOARCH=amd64 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/agent ./cmd/agent
	CGO_ENABLED=0 GOARCH=arm64 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/agent-arm64 ./cmd/agent

.PHONY: image-binaries
image-binaries: build ## what the image holds besides the agents: bin/agentboot-linux-amd64 and bin/agentboot-linux-arm64
	CGO_ENABLED=0 GOARCH=amd64 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/agentboot-linux-amd64 ./cmd/agentboot
	CGO_ENABLED=0 GOARCH=arm64 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/agentboot-linux-arm64 ./cmd/agentboot

# The kustomization whose agentboot image entry make image points at the
# digest it built (empty: none; make e2e builds the image without it).
IMAGE_PIN ?= deploy/kustomization.yaml
# The repository the pinned entry names (its newName), where you push the
# image; empty keeps the one it has.
IMAGE_NAME ?=

.PHONY: image
image: image-binaries ## dist/image: the OCI image (linux/amd64, linux/arm64), dist/image.oci.tar and SBOMs, no Docker needed; points deploy/ at its digest
	go run ./hack/image -bin $(BIN) -cache $(AGENTBOOT_CACHE)/debs -out dist/image -version $(VERSION) -epoch $$(git log -1 --format=%ct) -kustomization "$(IMAGE_PIN)" -name "$(IMAGE_NAME)"

.PHONY: image-debs
image-debs: ## the Debian packages hack/image/debian.lock pins, downloaded once into $(AGENTBOOT_CACHE)/debs
	go run ./hack/image -fetch -cache $(AGENTBOOT_CACHE)/debs

.PHONY: image-lock
image-lock: ## pin anew the Debian packages the image takes xorriso, ipmitool and CA certificates from (hack/image/debian.lock)
	go run ./hack/image -lock-anew -cache $(AGENTBOOT_CACHE)/debs

.PHONY: pxe-grub
pxe-grub: ## bin/pxe/grubnetaa64.efi: agentboot's netboot GRUB for arm64 UEFI PXE clients (agentboot pxe --arm64-binary), from Debian's grub-efi-arm64-bin
	go run ./test/devimage/build --pxe-grub $(BIN)/pxe/grubnetaa64.efi --cache $(AGENTBOOT_CACHE)

.PHONY: testbin
testbin: ## etcd, kube-apiserver and kubectl, built from the Go module proxy (cached)
	@bash test/testbin/build.sh $(TESTBIN)

.PHONY: controller-gen
controller-gen:
	@bash hack/gotool.sh controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen v0.23.0

.PHONY: tools
tools: controller-gen ## small tools tests use (the upstream Ignition validator), cached
	@bash hack/gotool.sh ignition-validate github.com/coreos/ignition/v2/validate v2.26.0

.PHONY: generate
generate: controller-gen testbin ## deepcopy functions and CRDs from api/; the Helm chart's templates from deploy/
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/agentinstall/... paths=./api/agentboot/... paths=./api/metal3/... output:crd:dir=deploy/crds
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/hypershift/... output:crd:dir=test/crds
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/hive/... paths=./api/hiveext/... output:crd:dir=deploy/components/hive-crds
	go run ./hack/chart -kubectl $(BIN)/testbin/kubectl

.PHONY: verify
verify: generate ## gofmt, go vet, and generated files up to date
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags e2e ./test/e2e/... ./test/container/... ./nodepool/
	go vet -tags bench ./test/bench/...
	@git diff --exit-code -- api deploy/crds deploy/components deploy/chart test/crds || { echo "generated files are stale: run make generate and commit"; exit 1; }
	@new=$$(git ls-files --others --exclude-standard -- api deploy/crds deploy/components deploy/chart test/crds); if [ -n "$$new" ]; then echo "generated files not committed:"; echo "$$new"; exit 1; fi

.PHONY: dev-image
dev-image: ## the dev OS live ISO (from Debian packages; cached) in dist/dev-image
	go run ./test/devimage/build --out dist/dev-image --cache $(AGENTBOOT_CACHE)

.PHONY: prereqs
prereqs: ## Go and the Debian packages (installed when root), checked in seconds before any long build
	@bash hack/prereqs.sh

DEV_ARGS = $(if $(FRESH),--fresh) $(if $(ADVERTISE_ADDRESS),--advertise-address=$(ADVERTISE_ADDRESS)) $(ARGS)

# The slowest test packages, longest first: go test starts packages in the
# order it is given them, and one started last (test/boot came last in
# ./...'s order) ran alone for minutes at the end of the suite.
SLOW_TESTS := ./test/boot ./bmc ./hack/image ./nodepool ./agent-service ./image-service ./cmd/agentboot ./deploy ./infraenv-controller ./agent-service/internal/steps

# What the tests need, built after the prerequisites are checked.
.PHONY: test-deps
test-deps: prereqs
	@$(MAKE) --no-print-directory testbin tools dev-image image-debs build vm-accel

# KVM only on positive evidence (a guest under qemu's KVM reached the dev
# kernel), else TCG; the answer is kept per machine boot, qemu, /dev/kvm and
# dev ISO in $(AGENTBOOT_CACHE)/vm-accel.json (CONTRIBUTING: "VMs in tests").
.PHONY: vm-accel
vm-accel: ## print which qemu accelerator the VM tests use and why (AGENTBOOT_QEMU_ACCEL overrides)
	@go run ./test/vm/accel

# Four test binaries at once: bmc, nodepool and agent-service mostly wait
# (on simulated BMCs, hosted clusters, timers: 60-90 % of their time), so
# others run beside them. On 2 cores warm make test took 8:05 with -p 2,
# 7:02 with -p 3, 6:25 with -p 4 and test/boot's boots merged; it is now
# CPU-bound (1.9 cores busy for 735 CPU seconds). -race: no gain.
.PHONY: test
test: test-deps ## every test that needs no root (the slowest packages are listed at the end)
	@$(call go-test-timed,go test -p 4 $(GO_TEST_FLAGS) $(SLOW_TESTS) ./...)

# The same tests with the race detector. It makes the tests' own code 3-4
# times as costly (image-service: 25 CPU seconds without, 84 with) and the
# suite keeps both cores busy, so make test leaves it out. CI runs both:
# make test as a newcomer runs it, make test-race for the races.
.PHONY: test-race
test-race: test-deps ## make test with the race detector (CI runs it after make test)
	@$(call go-test-timed,go test -race $(GO_TEST_FLAGS) $(SLOW_TESTS) ./...)

# go-test-timed runs a go test command as it is, then lists the five
# slowest packages, where the suite's time goes; its exit code is go test's.
define go-test-timed
echo '$(1)'; log=$$(mktemp); trap 'rm -f "$$log"' EXIT; set -o pipefail; \
$(1) 2>&1 | tee "$$log"; rc=$$?; \
echo "slowest packages:"; awk '($$1 == "ok" || $$1 == "FAIL") && $$3 ~ /s$$/ { t = $$3; sub(/s$$/, "", t); printf "  %7.1fs  %s\n", t, $$2 }' "$$log" | sort -rn | head -5; \
exit $$rc
endef

.PHONY: run
run: prereqs ## the whole service locally on a real control plane (FRESH=1, ADVERTISE_ADDRESS=<ip>, ARGS=...)
	@$(MAKE) --no-print-directory build
	@$(BIN)/agentboot dev --preflight $(DEV_ARGS)
	@$(MAKE) --no-print-directory testbin dev-image
	$(BIN)/agentboot dev $(DEV_ARGS)

.PHONY: clean
clean: ## remove bin/ and the dev state (the tool cache is kept)
	rm -rf $(BIN) .agentboot

.PHONY: help
help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

.PHONY: bench-images
bench-images: testbin dev-image build ## customised-ISO throughput vs http.ServeFile, first byte, memory per download
	go run ./test/bench/images

HOSTS ?= 50
AGENTS ?= 2000
# InfraEnvs the hosts are spread over, and how long they take to start
# (AGENTS/RAMP arrivals a second): 2000 over 40 s is 50/s.
INFRAENVS ?= 1
RAMP ?= 40s
# Shares of the hosts then bound and installed, and bound and joining their
# hosted cluster (the manager polls those): 0.2 and 0.05 are issue 36's.
BOUND ?= 0
INSTALLING ?= 0
# Clients of make bench-storm, all network-booting at once.
STORM ?= 1000
HONEST ?= 500

.PHONY: bench-agents
bench-agents: testbin build ## AGENTS simulated hosts (2000) against the agent API: registration latency, apiserver writes
	go run ./test/bench/agents -agents $(AGENTS) -infraenvs $(INFRAENVS) -ramp $(RAMP) -bound $(BOUND) -installing $(INSTALLING)

.PHONY: bench-abuse
bench-abuse: testbin build ## HONEST (500) heartbeating hosts while one registration token's holder writes at full speed: etcd write bytes/s and growth, honest heartbeat p99
	go run ./test/bench/agents -abuse -agents $(HONEST) -ramp 20s -window 60s

.PHONY: bench-bmc
bench-bmc: testbin ## HOSTS (50) BareMetalHosts on simulated Redfish BMCs, ideal vs realistic timing: enrollment, calls per BMC per minute
	go test -tags bench -run TestBenchBMC -count=1 -timeout 60m -v ./test/bench/bmc -args -hosts $(HOSTS)

# make bench-install: hosts bound at once, and how long each writes its image.
INSTALLING_HOSTS ?= 200
WRITE ?= 60s
.PHONY: bench-install
bench-install: testbin ## INSTALLING_HOSTS (200) hosts bound at once install and join a real hosted apiserver: agentboot's time per host beyond the image write (WRITE, 60s)
	go test -tags bench -run TestBenchInstall -count=1 -timeout 60m -v ./test/bench/install -args -hosts $(INSTALLING_HOSTS) -write $(WRITE)

GIB ?= 2
.PHONY: bench-sanitize
bench-sanitize: testbin dev-image build ## agent disk erase on the VM lab's disks (GIB each, 2): seconds per GiB per method vs dd
	go test -tags bench -run TestBenchSanitize -count=1 -timeout 90m -v ./test/bench/sanitize -args -gib $(GIB)

.PHONY: bench-smoke
bench-smoke: testbin dev-image build ## every benchmark at a small size, as CI runs them: each runs end to end (no timing is asserted; the figures mean nothing at this size)
	go run ./test/bench/agents -agents 100 -infraenvs 2 -ramp 5s -poll 5s -window 10s -bound 0.2 -installing 0.05
	go run ./test/bench/agents -agents 100 -infraenvs 2 -ramp 10s -poll 5s -window 10s -failover
	go run ./test/bench/images -clients 1,4 -duration 1s -repeats 1
	go run ./test/bench/images -failover 4
	go test -tags bench -run TestBenchBMC -count=1 -timeout 20m -v ./test/bench/bmc -args -hosts 3 -window 20s
	go test -tags bench -run TestBenchInstall -count=1 -timeout 20m ./test/bench/install -args -hosts 5 -write 5s
	@if [ "$$(id -u)" = 0 ]; then go run ./test/bench/pxe -duration 1s -repeats 1 -real-client-runs 2; else echo "bench-smoke: bench-pxe skipped (it needs root)"; fi
	@if [ "$$(id -u)" = 0 ]; then go run ./test/bench/pxe -storm 20 -repeats 1; else echo "bench-smoke: bench-storm skipped (it needs root)"; fi

.PHONY: bench-pxe
bench-pxe: build ## DHCP offers/s and TFTP throughput vs dnsmasq in network namespaces (root)
	@[ "$$(id -u)" = 0 ] || { echo "make bench-pxe needs root (network namespaces)"; exit 1; }
	go run ./test/bench/pxe $(ARGS)

.PHONY: bench-storm
bench-storm: build ## a boot storm: STORM (1000) clients in network namespaces network-boot at once to their kernel, agentboot vs dnsmasq + a static HTTP server (root)
	@[ "$$(id -u)" = 0 ] || { echo "make bench-storm needs root (network namespaces)"; exit 1; }
	go run ./test/bench/pxe -storm $(STORM) $(ARGS)

.PHONY: e2e
e2e: testbin tools dev-image build pxe-grub ## the VM lab: real VMs in a network namespace, and the image run as its manifests run it (root)
	@[ "$$(id -u)" = 0 ] || { echo "make e2e needs root (network namespaces, taps)"; exit 1; }
	@$(MAKE) --no-print-directory vm-accel
	@$(MAKE) --no-print-directory image IMAGE_PIN=
	@rm -f dist/e2e/boot-times.md
	go test -tags e2e -count=1 -timeout 60m $(GO_TEST_FLAGS) ./test/e2e/... ./test/container/...
	@[ ! -f dist/e2e/boot-times.md ] || cat dist/e2e/boot-times.md
	go test -tags e2e -count=1 -timeout 20m -run '^TestUpgradeMidInstallation$$' $(GO_TEST_FLAGS) ./nodepool/

# Each target runs a fixed number of inputs, about 10 s of work on 2 cores
# (measured 2026-11-27), not for a wall-clock time: with a time, Go 1.26's fuzz
# coordinator can fail a target at the deadline with a bare "context deadline
# exceeded" and no input (go.dev/issue/75804, fixed in Go 1.27; it failed
# FuzzServerPackets and FuzzInventory here). A count has no deadline to race;
# a loaded machine only takes longer. FUZZ_TIME=60s (or 100000x) runs every
# target for that instead.
FUZZ_TIME ?=
fuzztime = $(or $(FUZZ_TIME),$(1))

.PHONY: fuzz
fuzz: dev-image ## every fuzz target for a fixed number of inputs (about 10 s each; FUZZ_TIME=60s for longer)
	go test -run XXX -fuzz FuzzOpen -fuzztime $(call fuzztime,100000x) ./internal/iso9660/
	go test -run XXX -fuzz FuzzInventory -fuzztime $(call fuzztime,50000x) ./agent-service/internal/hostapi/
	go test -run XXX -fuzz FuzzIPXEScript -fuzztime $(call fuzztime,50000x) ./internal/discovery/
	go test -run XXX -fuzz FuzzGRUBScript -fuzztime $(call fuzztime,50000x) ./internal/discovery/
	go test -run XXX -fuzz FuzzDHCP -fuzztime $(call fuzztime,80000x) ./pxe/
	go test -run XXX -fuzz FuzzUnserved6 -fuzztime $(call fuzztime,80000x) ./pxe/internal/dhcp/
	go test -run XXX -fuzz FuzzTFTPName -fuzztime $(call fuzztime,60000x) ./pxe/
	go test -run XXX -fuzz '^FuzzParseRequest$$' -fuzztime $(call fuzztime,250000x) ./pxe/internal/tftpd/
	go test -run XXX -fuzz '^FuzzTransferAcks$$' -fuzztime $(call fuzztime,300000x) ./pxe/internal/tftpd/
	go test -run XXX -fuzz '^FuzzServerPackets$$' -fuzztime $(call fuzztime,1500x) ./pxe/internal/tftpd/
