# stage-lib.sh — sourced by the stage-*.sh scripts: copies a dynamically
# linked program into an image's root filesystem with every library ldd
# lists for it, so that it runs on an image FROM scratch.
#
# stage_file ROOTFS FILE — copy FILE to the same path under ROOTFS,
# following symlinks, and keep the symlink name too (ld-linux is reached
# through /lib64).
stage_file() {
	local rootfs=$1 src=$2 real
	real=$(readlink -f "$src")
	mkdir -p "$rootfs$(dirname "$real")"
	cp -p "$real" "$rootfs$real"
	if [ "$src" != "$real" ]; then
		mkdir -p "$rootfs$(dirname "$src")"
		ln -sfn "$real" "$rootfs$src"
	fi
}

# stage_libs ROOTFS PROGRAM — the libraries ldd lists for PROGRAM (which
# may lie outside ROOTFS), and /lib64 and /lib as symlinks where this host
# has merged /usr.
stage_libs() {
	local rootfs=$1 prog=$2 d
	# ldd prints "name => /path (addr)" or "/path (addr)"; vdso has no path.
	ldd "$prog" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i}' |
		while read -r lib; do stage_file "$rootfs" "$lib"; done
	for d in /lib64 /lib; do
		if [ -L "$d" ] && [ ! -e "$rootfs$d" ]; then ln -sfn "$(readlink "$d")" "$rootfs$d"; fi
	done
}
