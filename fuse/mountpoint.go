package fuse

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// MountInfo is one line of /proc/self/mountinfo that matters here.
type MountInfo struct {
	Mountpoint string
	FSType     string
	Source     string
}

// ReadMountInfo parses a mountinfo table (proc(5)): the mount point is the
// fifth field, and after the " - " separator come the file system type and
// the source. Octal escapes (\040 for a space) are decoded.
func ReadMountInfo(r io.Reader) ([]MountInfo, error) {
	var out []MountInfo
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 5 || len(g) < 2 {
			continue
		}
		out = append(out, MountInfo{
			Mountpoint: unescapeOctal(f[4]),
			FSType:     g[0],
			Source:     unescapeOctal(g[1]),
		})
	}
	return out, sc.Err()
}

// unescapeOctal decodes the \ooo escapes the kernel writes for spaces,
// tabs, newlines and backslashes in mountinfo fields.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// MountedAt reports the mount (the last one, which hides earlier ones) at
// exactly the path dir, if any.
func MountedAt(dir string) (MountInfo, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return MountInfo{}, false, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	infos, err := ReadMountInfo(f)
	if err != nil {
		return MountInfo{}, false, fmt.Errorf("read mount table: %w", err)
	}
	var found MountInfo
	ok := false
	for _, m := range infos {
		if m.Mountpoint == dir {
			found, ok = m, true
		}
	}
	return found, ok, nil
}

// isFUSE reports whether a mount type is a FUSE file system.
func isFUSE(fstype string) bool {
	return fstype == "fuse" || fstype == "fuseblk" || strings.HasPrefix(fstype, "fuse.")
}

// ErrNotDirectory and ErrAlreadyMounted are the refusals of
// PrepareMountpoint; the wrapping error names the path.
var (
	ErrNotDirectory   = errors.New("mountpoint is not a directory")
	ErrAlreadyMounted = errors.New("mountpoint is already mounted")
)

// statTimeout bounds the stat of a mountpoint: a FUSE server that is alive
// but stuck would otherwise hang `memfs mount` itself.
const statTimeout = 5 * time.Second

// PrepareMountpoint checks that dir can be mounted on and returns its
// absolute, symlink-free path. A stale FUSE mount (its server was killed,
// so stat fails with ENOTCONN) is cleared with `fusermount3 -uz`. A live
// mount is refused with ErrAlreadyMounted unless force is set, in which
// case a FUSE mount is lazily unmounted; other file systems are never
// unmounted.
func PrepareMountpoint(ctx context.Context, dir string, force bool) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", dir, err)
	}
	fi, err := statWithTimeout(ctx, abs)
	if isStale(err) {
		slog.Warn("clearing stale FUSE mount left by a dead process", "dir", abs, "err", err)
		if uerr := fusermountUnmount(ctx, abs, true); uerr != nil {
			return "", fmt.Errorf("mountpoint %s is a stale FUSE mount and clearing it failed: %w", abs, uerr)
		}
		fi, err = statWithTimeout(ctx, abs)
	}
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s: %w", abs, ErrNotDirectory)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	m, mounted, err := MountedAt(real)
	if err != nil || !mounted {
		return real, err
	}
	if !force {
		return "", fmt.Errorf("%s (%s from %s): %w; unmount it first (fusermount3 -u %s) or pass --force-unmount",
			real, m.FSType, m.Source, ErrAlreadyMounted, real)
	}
	if !isFUSE(m.FSType) {
		return "", fmt.Errorf("%s is a %s mount, not FUSE; --force-unmount only detaches FUSE mounts: %w", real, m.FSType, ErrAlreadyMounted)
	}
	slog.Warn("detaching the FUSE mount already on the mountpoint", "dir", real, "fstype", m.FSType)
	if err := fusermountUnmount(ctx, real, true); err != nil {
		return "", fmt.Errorf("detach %s: %w", real, err)
	}
	return real, nil
}

// isStale reports the errors stat gives on a FUSE mount whose server
// process is gone.
func isStale(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// statWithTimeout stats path in a goroutine so that a hung FUSE server
// cannot hang the caller; on timeout it reports ETIMEDOUT and leaves the
// goroutine blocked in the kernel.
func statWithTimeout(ctx context.Context, path string) (os.FileInfo, error) {
	type res struct {
		fi  os.FileInfo
		err error
	}
	ch := make(chan res, 1)
	go func() {
		fi, err := os.Stat(path)
		ch <- res{fi, err}
	}()
	t := time.NewTimer(statTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.fi, r.err
	case <-t.C:
		return nil, &os.PathError{Op: "stat", Path: path, Err: syscall.ETIMEDOUT}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Fusermount is the helper that mounts and unmounts FUSE file systems
// without privileges.
const Fusermount = "fusermount3"

// fusermountUnmount runs `fusermount3 -u` (with lazy: -uz, which detaches
// even a busy or dead mount).
func fusermountUnmount(ctx context.Context, dir string, lazy bool) error {
	flag := "-u"
	if lazy {
		flag = "-uz"
	}
	out, err := exec.CommandContext(ctx, Fusermount, flag, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s %s: %w: %s", Fusermount, flag, dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Available reports why FUSE mounts cannot be made here, or nil when
// /dev/fuse and fusermount3 are present.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("no /dev/fuse: %w", err)
	}
	if _, err := exec.LookPath(Fusermount); err != nil {
		return fmt.Errorf("no %s (Debian package fuse3): %w", Fusermount, err)
	}
	return nil
}
