#!/usr/bin/env bash
# stage-fuse.sh ROOTFS — lays out the root filesystem of the client image in
# ROOTFS: a static busybox (shell + coreutils for the workload), fusermount3
# with every library ldd lists for it, and the few /etc files a FUSE mount
# needs. Nothing is downloaded: the files come from this host's Debian
# packages (fuse3, busybox-static), installed with apt-get when missing.
set -euo pipefail

rootfs=${1:?usage: stage-fuse.sh ROOTFS}

need_pkg() { # need_pkg FILE PACKAGE
	[ -x "$1" ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "stage-fuse: $1 missing; install Debian package $2" >&2
		exit 1
	fi
	echo "stage-fuse: installing $2" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }
}

need_pkg /usr/bin/fusermount3 fuse3
need_pkg /bin/busybox busybox-static

# busybox-static must really be static: the image has no loader for it.
if ldd /bin/busybox >/dev/null 2>&1; then
	echo "stage-fuse: /bin/busybox is dynamic; install busybox-static" >&2
	exit 1
fi

rm -rf "$rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,tmp,mnt/memfs,state,proc,sys,dev}
chmod 1777 "$rootfs/tmp"

. "$(dirname "$0")/stage-lib.sh"
stage_file "$rootfs" /usr/bin/fusermount3
stage_libs "$rootfs" /usr/bin/fusermount3

cp /bin/busybox "$rootfs/bin/busybox"
# One symlink per applet, as `busybox --install -s` would make them, but
# without overwriting fusermount3 or anything staged above.
/bin/busybox --list-full | while read -r applet; do
	[ -e "$rootfs/$applet" ] || [ -L "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
done

cat >"$rootfs/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PW
cat >"$rootfs/etc/group" <<'GR'
root:x:0:
nogroup:x:65534:
GR
# fusermount3 reads this; allow_other lets non-root readers use the mount.
echo user_allow_other >"$rootfs/etc/fuse.conf"
# fusermount3 skips /etc/mtab updates when it is a link to /proc/mounts.
ln -sfn /proc/self/mounts "$rootfs/etc/mtab"

echo "stage-fuse: staged $(find "$rootfs" -type f | wc -l) files into $rootfs" >&2
