# Shoal in a container: Debian's base image and Debian's packages only.
#
#   docker build -t shoal .
#   docker run --rm shoal shoal run -n 4 -- shoal_demo --count 100000
#   docker run --rm shoal shoal run -n 2 -- fashion_mnist --epochs 1 --threads 1
#
# Two stages: the first builds and installs into /opt/shoal (no tests, no benchmarks); the
# second is the slim base image with the run-time libraries, /opt/shoal (the launcher, the
# examples, the tools, and the headers, libraries and CMake package for building against
# Shoal) and the Fashion-MNIST data. The Kubernetes example (examples/k8s/) runs this image.
FROM debian:bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake ninja-build pkg-config \
      libssl-dev zlib1g-dev libsqlite3-dev libcli11-dev nlohmann-json3-dev libfmt-dev \
      libcpp-httplib-dev libopenmpi-dev openmpi-bin libtorch-dev libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_BUILD_TESTS=OFF \
      -DSHOAL_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=/opt/shoal \
 && cmake --build /build \
 && cmake --install /build

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libfmt9 libssl3 libsqlite3-0 zlib1g \
      libcpp-httplib0.11 libopenmpi3 openmpi-bin libtorch1.13 libopenblas0 dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/shoal /opt/shoal
# One BLAS thread per rank: ranks share the pod's cores.
ENV PATH=/opt/shoal/bin:$PATH OPENBLAS_NUM_THREADS=1
CMD ["shoal", "--help"]
