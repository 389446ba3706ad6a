package fuse

import (
	"bytes"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDirectWritesSeenByBufferedReads writes through an O_DIRECT
// descriptor and reads through a buffered one of the same mount after each
// write: every byte is the new one. The kernel sends a direct write's
// pieces (of the binding's request size) all at once, so the mount gets
// concurrent writes of one handle; one of them was lost now and then,
// which a reader saw as stale data.
func TestDirectWritesSeenByBufferedReads(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	const size = 4 << 20
	p := filepath.Join(m.Dir(), "f")
	within(t, 2*time.Minute, "direct writes", func() error {
		if err := writeFileSync(p, bytes.Repeat([]byte("-"), size)); err != nil {
			return err
		}
		rd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(rd)
		wr, err := syscall.Open(p, syscall.O_RDWR|syscall.O_DIRECT|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(wr)
		got := make([]byte, size)
		for round := range 30 {
			c := byte('A' + round%26)
			if n, err := syscall.Pwrite(wr, bytes.Repeat([]byte{c}, size), 0); err != nil || n != size {
				return fmt.Errorf("round %d: direct write: %d, %w", round, n, err)
			}
			if n, err := syscall.Pread(rd, got, 0); err != nil || n != size {
				return fmt.Errorf("round %d: buffered read: %d, %w", round, n, err)
			}
			if i := bytes.IndexFunc(got, func(r rune) bool { return r != rune(c) }); i >= 0 {
				return fmt.Errorf("round %d: byte %d is %q after a direct write of %q", round, i, got[i], c)
			}
		}
		return nil
	})
}

func writeFileSync(p string, data []byte) error {
	fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if _, err := syscall.Write(fd, data); err != nil {
		return err
	}
	return syscall.Fsync(fd)
}
