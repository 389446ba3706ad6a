package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/progress"
)

// Copies in both directions go to a temporary name beside the target and
// are renamed over it only once complete, so a failed or interrupted copy
// leaves the target as it was (absent, or its old content), as rsync does.
// The temporary name is hidden (a leading dot) and says what made it, so
// that the leftover of a killed copy is recognisable.

// cleanupTimeout bounds removing a failed copy's temporary file; it runs
// under its own context because the command's may be what ended.
const cleanupTimeout = 10 * time.Second

// tempName is a hidden sibling name for target, unique per call.
func tempName(target, kind string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	dir, base := path.Split(target)
	return dir + "." + base + ".memfs-" + kind + "-" + hex.EncodeToString(b[:])
}

// putStream copies in to the remote file target through a temporary file
// that is renamed over target once everything is written, counting the
// bytes on bar. An existing target keeps its permission bits.
func putStream(ctx context.Context, c *client.Client, in io.Reader, target string, bar *progress.Bar) (err error) {
	perm := fs.FileMode(0o644)
	if fi, err := c.Stat(target); err == nil {
		if fi.IsDir() {
			return &fs.PathError{Op: "put", Path: target, Err: syscall.EISDIR}
		}
		perm = fi.Mode().Perm()
	}
	tmp := tempName(target, "put")
	out, err := c.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return namePath(err, target)
	}
	defer func() {
		if err == nil {
			bar.Finish()
			return
		}
		bar.Stop()
		_ = out.Close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := c.WithContext(cctx).Remove(tmp); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = fmt.Errorf("%w (and %s is left behind: %v)", err, tmp, rerr)
		}
	}()
	if _, err := io.CopyBuffer(onlyWriter{out}, io.TeeReader(in, bar), make([]byte, copyBuf)); err != nil {
		return copyError(ctx, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return c.Rename(tmp, target)
}

// getFile copies the remote file name to the local file target through a
// temporary file in target's directory, synced and renamed over target
// once complete, counting the bytes on a bar made by newBar with the
// file's size. An existing target keeps its permission bits; a new one
// gets 0666 less the umask, as a file made by a shell redirection.
func getFile(ctx context.Context, c *client.Client, name, target string, newBar func(size int64) *progress.Bar) (err error) {
	perm := 0o666 &^ fs.FileMode(umask())
	if fi, err := os.Stat(target); err == nil {
		if fi.IsDir() {
			return &fs.PathError{Op: "get", Path: target, Err: syscall.EISDIR}
		}
		perm = fi.Mode().Perm()
	}
	// Opened first, so that a missing or unreadable source creates nothing.
	f, err := c.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	dir, base := filepath.Split(target)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".memfs-get-*")
	if err != nil {
		return namePath(err, target)
	}
	size := int64(-1)
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	bar := newBar(size)
	defer func() {
		if err != nil {
			bar.Stop()
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
			return
		}
		bar.Finish()
	}()
	if _, err := io.CopyBuffer(onlyWriter{tmp}, io.TeeReader(f, bar), make([]byte, copyBuf)); err != nil {
		return copyError(ctx, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}

// copyError says that an interrupted copy was interrupted (the client's
// own error would be a bare "context canceled").
func copyError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return explainedError{fmt.Errorf("interrupted; the target was left as it was (%w)", err)}
	}
	return err
}

// namePath makes a path error about a temporary file name the target the
// user gave instead.
func namePath(err error, target string) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		pe.Path = target
	}
	return err
}

// umask reads the process's file mode creation mask.
func umask() int {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return m
}
