# isobar — build, test and code-generation targets. `make help` lists them.
GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(CURDIR)/.bin
export PATH := $(TOOLS):$(PATH)

BUF_VERSION              := v1.75.0
PROTOC_GEN_GO_VERSION    := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION      := v0.8.2

# Fuzz targets run by `make fuzz` (package:target), FUZZTIME each. Every
# Fuzz* function in the repository belongs here. FUZZMINIMIZE bounds the
# minimisation of each new input: with Go's default (60 s) a target seeded
# with large fixture pages spends a short run minimising, not fuzzing.
FUZZTIME ?= 20s
FUZZMINIMIZE ?= 2s
FUZZ_TARGETS := \
	./regional:FuzzValidateHeartbeat \
	./regional:FuzzValidateReport \
	./regional:FuzzDecodeWarmState \
	./cellagent:FuzzParseVLLM \
	./cellagent:FuzzParseDCGM \
	./cellagent:FuzzParseModels \
	./sim:FuzzParseGenRequest \
	./sim:FuzzParseFaultRequest \
	./sim:FuzzPromptBlockHashes \
	./summary:FuzzValidate \
	./regional/gossip:FuzzReceive \
	./regional/gossip:FuzzDecodeMeta \
	./regional/gossip:FuzzParseKey \
	./regional/gossip:FuzzDecodeCoordinate \
	./regional/gossip:FuzzVerifyProof \
	./bench/scalemodel:FuzzParseReport \
	./optimize:FuzzSolve \
	./optimize:FuzzParseInput \
	./regional:FuzzPlanTable \
	./regional:FuzzParseEndpointMap \
	./global:FuzzAcceptSummary \
	./regional/xds:FuzzBuild \
	./regional/xds:FuzzStreamRequests \
	./regional/xds:FuzzDeltaStreamRequests \
	./xdscontract:FuzzEndpointMetadata \
	./xdscontract:FuzzLEDSCollectionOf \
	./gateway/xdsclient:FuzzDecode \
	./gateway/prefix:FuzzPromptText \
	./gateway/prefix:FuzzIndex \
	./gateway:FuzzBodyModel \
	./gateway:FuzzHopProof \
	./gateway/xdsclient:FuzzRouteMatch \
	./gateway/xdsclient:FuzzDeltaLbEndpoint \
	./chaos:FuzzParseScenario \
	./adminapi:FuzzDecodeFault \
	./reqclass:FuzzNormalizeTenant \
	./residency:FuzzParse \
	./gateway/flowcontrol:FuzzQueueOps \
	./gateway:FuzzClassify \
	./gateway:FuzzClassFlags \
	./statusview:FuzzAnswers \
	./election:FuzzCheckEndpoint \
	./election:FuzzPrefixAndFence \
	./certs:FuzzParseIdentity \
	./certs:FuzzParseCertificates \
	./certs:FuzzParseKey \
	./regional/capacity:FuzzObserve \
	./gateway:FuzzStatedContextLimit \
	./gateway/extproc:FuzzExtProcStream \
	./internal/truncate:FuzzTruncate

.PHONY: help build test test-short run proto verify-genproto fix-genproto lint fmt verify tidy verify-tidy bench fuzz tools clean

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build bin/isobar
	$(GO) build -o $(BIN)/isobar ./cmd/isobar

# The packages that run whole fleets (labs, drills, the CLI's lab tests)
# run one at a time after the rest: beside one another and the bench under
# the race detector, on a 2-core machine, their real timers (heartbeats,
# gossip probes, leases) starve and their drills measure the starvation.
FLEET_PKGS := lab chaos cmd/isobar

test: ## run every test with the race detector (what CI runs)
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v -x $(foreach p,$(FLEET_PKGS),-e '.*/$(p)'))
	$(GO) test -race -count=1 -timeout 20m -p 1 $(foreach p,$(FLEET_PKGS),./$(p)/)

test-short: ## run the tests without the race detector
	$(GO) test -count=1 ./...

run: build ## run the embedded default: a simulated fleet with traffic and a live view
	$(BIN)/isobar lab

bench: ## control-plane benchmarks (cycle cost, heartbeat ingest, xDS build)
	$(GO) test -run '^$$' -bench . -benchmem ./regional/... ./global/... ./summary/... ./cellagent/...

.PHONY: paper scale
paper: build ## the published evaluation, quick size, into bench-out/paper (about 15 s)
	$(BIN)/isobar bench paper --quick --out bench-out/paper

scale: build ## the control-plane scale suite into bench-out/scale (minutes)
	$(BIN)/isobar bench scale --out bench-out/scale

fuzz: ## run each fuzz target for FUZZTIME
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$pkg; \
	done

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc ## install pinned code generators into .bin

$(TOOLS)/buf:
	GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

proto: tools ## regenerate proto/isobarpb from proto/isobar/v1
	buf lint
	buf generate

fix-genproto: proto ## alias of proto

verify-genproto: proto ## fail if the committed generated code is stale
	git diff --exit-code -- proto/isobarpb

fmt: ## gofmt every Go file
	gofmt -w $$(git ls-files '*.go')

lint: $(TOOLS)/staticcheck ## gofmt check, go vet, staticcheck, the architecture tests (dependency rules in TestLayers, function and command-file sizes)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...
	$(GO) test -count=1 -run 'TestLayers|TestCommandFilesStaySmall|TestFunctionsStaySmall' ./cmd/isobar/

tidy: ## go mod tidy
	$(GO) mod tidy

verify-tidy: ## fail if go.mod/go.sum are not tidy
	$(GO) mod tidy -diff

verify: verify-tidy verify-genproto lint ## every verify-* check

clean: ## remove build outputs
	rm -rf $(BIN)

.PHONY: interop
interop: ## independent judges: grpc-js-xds and C-core xDS clients, etcd 3.4, promtool, Kubernetes schemas, podman (docs/interop.md)
	test/interop/run.sh

.PHONY: soak
soak: build ## 10-minute soak: etcd, global pair, 3 controllers, 1,000 synthetic cells with churn; RSS, goroutines, streams, plan epochs (not in make test)
	$(BIN)/isobar bench soak --duration 10m --cells 1000 --report soak.json
