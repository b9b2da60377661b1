# syntax=docker/dockerfile:1
# Multi-stage build: a static cronstream binary on a minimal, non-root image.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/cronstream ./cmd/cronstream \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/example-worker ./examples/worker

FROM gcr.io/distroless/static-debian12:nonroot AS cronstream
COPY --from=build /out/cronstream /usr/local/bin/cronstream
USER nonroot:nonroot
EXPOSE 8080
# distroless has no shell or curl: the binary checks its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/cronstream", "healthcheck", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/cronstream"]
CMD ["run"]

FROM gcr.io/distroless/static-debian12:nonroot AS example-worker
COPY --from=build /out/example-worker /usr/local/bin/example-worker
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/example-worker"]
