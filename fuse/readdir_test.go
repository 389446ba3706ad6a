package fuse

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// dirent is one record of getdents64.
type dirent struct {
	name string
	ino  uint64
	off  int64
}

// getdents reads one batch of directory fd (empty at the end) into a
// buffer of size bytes.
func getdents(fd, size int) ([]dirent, error) {
	buf := make([]byte, size)
	n, err := syscall.Getdents(fd, buf)
	if err != nil {
		return nil, err
	}
	var out []dirent
	for p := 0; p < n; {
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8,
		// name NUL-terminated.
		b := buf[p:n]
		reclen := int(binary.LittleEndian.Uint16(b[16:]))
		nm := string(b[19:reclen])
		if i := strings.IndexByte(nm, 0); i >= 0 {
			nm = nm[:i]
		}
		out = append(out, dirent{name: nm, ino: binary.LittleEndian.Uint64(b), off: int64(binary.LittleEndian.Uint64(b[8:]))})
		p += reclen
	}
	return out, nil
}

// readDirAll reads directory fd from its offset to the end with a buffer
// of size bytes.
func readDirAll(fd, size int) ([]dirent, error) {
	var all []dirent
	for {
		ds, err := getdents(fd, size)
		if err != nil || len(ds) == 0 {
			return all, err
		}
		all = append(all, ds...)
	}
}

// TestSeekdirAfterRewind gives seekdir an offset telldir returned before
// the directory changed and was listed again (rewinddir): the listing
// continues after the same entry, with each entry that did not change
// exactly once.
func TestSeekdirAfterRewind(t *testing.T) {
	if testBinding == "bazil" {
		t.Skip("bazil's directory offsets are byte positions in one listing (bazilfs.dirHandle)")
	}
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	d := filepath.Join(m.Dir(), "d")
	require.NoError(t, os.Mkdir(d, 0o755))
	touch := func(name string) {
		fd, err := syscall.Open(filepath.Join(d, name), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
		require.NoError(t, err)
		require.NoError(t, syscall.Close(fd))
	}
	for i := range 40 {
		touch(fmt.Sprintf("f%02d", i))
	}
	within(t, 60*time.Second, "seekdir after rewinddir", func() error {
		fd, err := syscall.Open(d, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		first, err := getdents(fd, 256) // a few entries: then telldir
		if err != nil || len(first) == 0 {
			return fmt.Errorf("first batch: %v %v", first, err)
		}
		pos := first[len(first)-1].off
		rest, err := readDirAll(fd, 4096)
		if err != nil {
			return err
		}
		// Entries come and go before and after the position.
		touch("a-new")
		touch("a-new2")
		touch("z-new")
		removed := map[string]bool{first[2].name: true, rest[3].name: true}
		for n := range removed {
			if err := syscall.Unlink(filepath.Join(d, n)); err != nil {
				return err
			}
		}
		if _, err := syscall.Seek(fd, 0, 0); err != nil {
			return err
		}
		if _, err := readDirAll(fd, 4096); err != nil {
			return err
		}
		if _, err := syscall.Seek(fd, pos, 0); err != nil {
			return err
		}
		again, err := readDirAll(fd, 4096)
		if err != nil {
			return err
		}
		seen := map[string]int{}
		for _, e := range again {
			seen[e.name]++
		}
		for _, e := range rest {
			if !removed[e.name] && seen[e.name] != 1 {
				return fmt.Errorf("%s seen %d times after seekdir (then %v)", e.name, seen[e.name], again)
			}
		}
		for _, e := range first {
			if seen[e.name] != 0 {
				return fmt.Errorf("%s, read before the offset, listed again after seekdir", e.name)
			}
		}
		return nil
	})
}

// TestReadDirWhileRenaming reads a directory of thousands of entries to
// the end, several times, while another goroutine renames some of them
// back and forth: every pass ends, and sees each entry that no rename
// touched exactly once.
func TestReadDirWhileRenaming(t *testing.T) {
	const files, moving = 3000, 100
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	d := filepath.Join(m.Dir(), "big")
	require.NoError(t, os.Mkdir(d, 0o755))
	within(t, 5*time.Minute, "fill", func() error {
		for i := range files {
			fd, err := syscall.Open(filepath.Join(d, fmt.Sprintf("f%04d", i)), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			syscall.Close(fd)
		}
		return nil
	})
	// Files f0000, f0030, ... move between their name and an r name.
	moves := func(name string) bool {
		var i int
		_, err := fmt.Sscanf(name[1:], "%d", &i)
		return name[0] == 'r' || err == nil && i%(files/moving) == 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := make(chan struct{})
	defer close(stop)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := (i % moving) * (files / moving)
			from, to := fmt.Sprintf("f%04d", k), fmt.Sprintf("r%04d", k)
			if (i/moving)%2 == 1 {
				from, to = to, from
			}
			_ = syscall.Rename(filepath.Join(d, from), filepath.Join(d, to))
		}
	}()
	for pass := range 4 {
		done := make(chan error, 1)
		go func() {
			done <- func() error {
				fd, err := syscall.Open(d, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				defer syscall.Close(fd)
				// A small buffer: many reads, each resuming at an offset.
				all, err := readDirAll(fd, 1024)
				if err != nil {
					return err
				}
				seen := map[string]int{}
				for _, e := range all {
					seen[e.name]++
				}
				for i := range files {
					n := fmt.Sprintf("f%04d", i)
					if !moves(n) && seen[n] != 1 {
						return fmt.Errorf("pass %d: %s seen %d times", pass, n, seen[n])
					}
				}
				return nil
			}()
		}()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatalf("pass %d did not finish: %v", pass, ctx.Err())
		}
	}
}
