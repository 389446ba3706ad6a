#!/usr/bin/env bash
# stage-prometheus.sh ROOTFS — lays out the root filesystem of the
# memfs-prometheus image in ROOTFS: Debian's prometheus binary (from the
# package apt-get downloads, not installed on this host) with the
# libraries ldd lists for it, the scrape configuration in
# prometheus/prometheus.yml, and an empty /prometheus for its data.
set -euo pipefail

rootfs=${1:?usage: stage-prometheus.sh ROOTFS}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/stage-lib.sh"

dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
# apt's sandbox user must be able to write where it downloads.
chmod 755 "$dl"
(cd "$dl" && apt-get download -qq prometheus 2>/dev/null ||
	{ apt-get update -qq && apt-get download -qq prometheus; })
dpkg-deb -x "$dl"/prometheus_*.deb "$dl/x"

rm -rf "$rootfs"
mkdir -p "$rootfs"/{etc/prometheus,prometheus,tmp,usr/bin}
chmod 1777 "$rootfs/tmp"
chown 65534:65534 "$rootfs/prometheus"
cp "$dl/x/usr/bin/prometheus" "$rootfs/usr/bin/prometheus"
stage_libs "$rootfs" "$rootfs/usr/bin/prometheus"
cp "$here/prometheus/prometheus.yml" "$rootfs/etc/prometheus/prometheus.yml"
cat >"$rootfs/etc/passwd" <<'PW'
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PW
echo "stage-prometheus: $("$rootfs/usr/bin/prometheus" --version 2>&1 | head -n 1)" >&2
