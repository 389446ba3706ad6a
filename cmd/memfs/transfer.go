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
	"sync"
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
	if err := writePieces(out, in, putPiece, putWindow, bar); err != nil {
		return copyError(ctx, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return c.Rename(tmp, target)
}

// A put writes pieces of putPiece bytes, putWindow at once. One piece at
// a time, a copy waits out every commit with nothing else to do; with
// many in flight the next are sent while earlier ones commit. Measured
// with 1 GiB (docs/benchmarks.md, "memfs put"): 8 MiB one at a time
// 30-39 MiB/s, 4 at a time 41-46, 8 at a time 43-49, 1 MiB 16 at a time
// 74-75.
const (
	putPiece  = 1 << 20
	putWindow = 16
)

// writePieces reads in to its end in pieces of size bytes and writes each
// at its offset in out, up to window at once, counting committed bytes on
// bar. Buffers are made as needed, so a small file costs one. It returns
// the first error, after the writes already sent have ended; what it
// leaves in out is then partial.
func writePieces(out io.WriterAt, in io.Reader, size, window int, bar *progress.Bar) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	free := make(chan []byte, window)
	made := 0
	var off int64
	for !failed() {
		var buf []byte
		select {
		case buf = <-free:
		default:
			if made < window {
				buf, made = make([]byte, size), made+1
			} else {
				buf = <-free
			}
		}
		n, rerr := io.ReadFull(in, buf)
		if n > 0 {
			wg.Add(1)
			go func(p []byte, at int64) {
				defer wg.Done()
				if _, err := out.WriteAt(p, at); err != nil {
					fail(err)
				} else {
					bar.Add(len(p))
				}
				free <- p[:cap(p)]
			}(buf[:n], off)
			off += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			fail(rerr)
		}
	}
	wg.Wait()
	return first
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
