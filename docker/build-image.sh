#!/usr/bin/env bash
# build-image.sh — builds the memfs-server and memfs-client images without a
# registry: a static memfs (CGO_ENABLED=0) on FROM scratch, plus for the
# client fusermount3, its libraries and busybox staged from this host.
#
# Env: MEMFS_TAG (image tag, default latest), GO (go command), MEMFS_BIN (a
# prebuilt static memfs to package instead of building one),
# MEMFS_PROMETHEUS=1 (also memfs-prometheus, for the compose profile
# "prometheus": stage-prometheus.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
tag=${MEMFS_TAG:-latest}
ctx=$here/build
go=${GO:-go}
command -v "$go" >/dev/null || go=/usr/local/go/bin/go

rm -rf "$ctx"
mkdir -p "$ctx/server-rootfs/data" "$ctx/server-rootfs/tmp" "$ctx/server-rootfs/certs"
chmod 1777 "$ctx/server-rootfs/tmp"

if [ -n "${MEMFS_BIN:-}" ]; then
	cp "$MEMFS_BIN" "$ctx/memfs"
else
	echo "build-image: go build ./cmd/memfs (static)" >&2
	(cd "$repo" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$ctx/memfs" ./cmd/memfs)
fi
# The images have no loader: refuse a dynamic binary.
if ldd "$ctx/memfs" >/dev/null 2>&1; then
	echo "build-image: $ctx/memfs is dynamically linked" >&2
	exit 1
fi

"$here/stage-fuse.sh" "$ctx/client-rootfs"
install -m 0755 "$here/client/memfs-client" "$here/client/workload.sh" "$here/client/verify.sh" \
	"$ctx/client-rootfs/usr/local/bin/"

imgs=(server client)
if [ "${MEMFS_PROMETHEUS:-}" = 1 ]; then
	"$here/stage-prometheus.sh" "$ctx/prometheus-rootfs"
	imgs+=(prometheus)
fi

rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git -C "$repo" diff --quiet HEAD 2>/dev/null; then rev=$rev-dirty; fi
for img in "${imgs[@]}"; do
	echo "build-image: memfs-$img:$tag" >&2
	# The legacy builder warns on stderr at every build; show it only on failure.
	if ! docker build -q --build-arg REVISION="$rev" -f "$here/Dockerfile.$img" -t "memfs-$img:$tag" "$ctx" >"$ctx/build-$img.log" 2>&1; then
		cat "$ctx/build-$img.log" >&2
		exit 1
	fi
done
# Rebuilds leave the previous images untagged; drop those (ours only).
for img in "${imgs[@]}"; do
	docker image prune -f --filter "label=org.opencontainers.image.title=memfs-$img" >/dev/null
done
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^memfs-(server|client|prometheus):$tag " >&2
