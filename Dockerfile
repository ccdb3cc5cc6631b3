# syntax=docker/dockerfile:1
#
# The `turnstile` controller image: a static (musl) binary on distroless/static, as uid 65532.
#   docker build -t turnstile:dev .
# Builds for the architecture of the build host (amd64 or arm64).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
# musl-gcc compiles the C parts of the TLS stack (ring) for the static target.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole workspace: Cargo needs every member's manifest to resolve the lock file.
COPY . .
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    target="$(uname -m)-unknown-linux-musl"; \
    rustup target add "$target"; \
    cargo build --release --locked --target "$target" -p turnstile --bin turnstile; \
    install -D -m 0755 "target/$target/release/turnstile" /out/turnstile

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=builder /out/turnstile /usr/local/bin/turnstile
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["run"]
