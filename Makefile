GO ?= go
PKGS ?= ./...
BENCHTIME ?= 1x
COUNT ?= 1

.PHONY: test lint bench build

## test: vet, then run every test with the race detector (what CI runs),
## eight tests of a package at a time; scripts/test.sh says how the
## packages are grouped so that the whole suite takes minutes.
test: lint
ifeq ($(PKGS),./...)
	GO=$(GO) bash scripts/test.sh
else
	$(GO) test -race -count=1 -timeout 20m -parallel 8 $(PKGS)
endif

## lint: formatting and vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## bench: every benchmark, benchstat-friendly output in bench.txt
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count $(COUNT) -benchtime $(BENCHTIME) -timeout 60m $(PKGS) | tee bench.txt

## build: the cronstream binary into ./bin
build:
	$(GO) build -o bin/cronstream ./cmd/cronstream

## chaos: chaos suite and network cut with real processes (short form, ~3 min),
## then a 60 s NATS outage under 200 entries firing every second;
## `make chaos DURATION=10m` runs the long form, CRONSTREAM_CHAOS_SEED=<n> replays a seed
CHAOS_TIMEOUT ?= 60m
.PHONY: chaos
chaos:
	$(if $(DURATION),CRONSTREAM_CHAOS_DURATION=$(DURATION)) $(GO) test -run 'TestChaos|TestNetworkCut' -count=1 -v -timeout $(CHAOS_TIMEOUT) ./chaos/
	CRONSTREAM_OUTAGE=60s $(GO) test -race -run 'TestNATSOutageKeepsFiring' -count=1 -v -timeout $(CHAOS_TIMEOUT) ./cmd/cronstream/
