# syntax=docker/dockerfile:1
# ditto's container image: `ditto serve` (gRPC 9010, HTTP 9011) as a non-root static-data
# binary on distroless. Everything the binary needs (model configs, GPU specs, coefficients,
# the default cluster, the proto descriptor set) is compiled in; the image holds nothing else.
#
#   docker build -t ditto:dev .
#   docker run --rm -p 9010:9010 -p 9011:9011 ditto:dev
#   docker run --rm -v $PWD/cluster.yaml:/etc/ditto/cluster.yaml:ro ditto:dev --check-config /etc/ditto/cluster.yaml

ARG RUST_VERSION=1.95

# --- build: a release binary from the locked dependency set ---------------------------------
FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The commit ditto_build_info{git_sha} reports (.git is not copied):
#   docker build --build-arg DITTO_GIT_SHA=$(git rev-parse --short=12 HEAD) .
ARG DITTO_GIT_SHA=unknown
COPY Cargo.toml Cargo.lock build.rs ./
COPY benches ./benches
COPY proto ./proto
COPY data ./data
COPY src ./src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ditto \
    && install -D -m 0755 target/release/ditto /out/ditto

# --- runtime: glibc + CA certs, no shell, no package manager --------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/ditto /usr/local/bin/ditto
# distroless' "nonroot" user, numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9010 9011
ENTRYPOINT ["/usr/local/bin/ditto", "serve"]
