package fuse

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReaderSeesWriterStillWriting: mount a writes a new file record by
// record without closing it (first through its journal, then, past what
// the journal carries, through write-behind under an exclusive capability)
// while a reader on another node reads it again and again: a client, and a
// second mount. Each read recalls a's capability, and a commits what it
// acknowledged before giving it back, so every read holds at least every
// record whose write returned before the read began, in order. The second
// mount's reads also recall its own capability as a writes, and it must
// neither answer from data fetched before it held one again nor let the
// kernel drop the size it was just given.
func TestReaderSeesWriterStillWriting(t *testing.T) {
	if testSync {
		t.Skip("with --sync, write-behind is close-to-open: a reader sees a file's writes once it is closed or synced")
	}
	for _, via := range []string{"client", "mount"} {
		t.Run(via, func(t *testing.T) {
			if via == "mount" && testBinding == BindingBazil {
				t.Skip("bazil.org/fuse cannot ask for FUSE_AUTO_INVAL_DATA, so a recall must tell the reader's kernel to drop its pages, and that can make it drop a size it was just given (docs/fuse.md, \"Capabilities\")")
			}
			readerSeesWriterStillWriting(t, via)
		})
	}
}

func readerSeesWriterStillWriting(t *testing.T, via string) {
	cl := startCluster(t, 3)
	addrs := cl.APIAddrs()
	a := mountOn(t, addrs[:1], Options{})
	read := newClient(t, addrs[1:2]).ReadFile
	if via == "mount" {
		b := mountOn(t, addrs[2:3], Options{})
		read = func(p string) ([]byte, error) { return os.ReadFile(filepath.Join(b.Dir(), p)) }
	}
	require.NoError(t, os.Mkdir(filepath.Join(a.Dir(), "d"), 0o755))
	f, err := os.Create(filepath.Join(a.Dir(), "d", "log"))
	require.NoError(t, err)
	defer f.Close()

	const records, size = 2500, 128 // 320 KiB: beyond what the journal carries for a file
	record := func(i int) []byte {
		r := fmt.Sprintf("%06d", i)
		return []byte(r + string(bytes.Repeat([]byte{'.'}, size-len(r)-1)) + "\n")
	}
	var written atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := range records {
			if _, err := f.Write(record(i)); err != nil {
				done <- err
				return
			}
			written.Store(int64(i + 1))
		}
		done <- nil
	}()

	reads := 0
	for finished := false; !finished; reads++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			finished = true
		default:
		}
		before := written.Load()
		var got []byte
		within(t, 30*time.Second, "read on another node", func() error {
			got, err = read("/d/log")
			return err
		})
		require.GreaterOrEqual(t, int64(len(got)), before*size, "read %d: %d records written before it began, %d bytes read", reads, before, len(got))
		for i := int64(0); i < before; i++ {
			require.Equal(t, record(int(i)), got[i*size:(i+1)*size], "record %d", i)
		}
	}
	t.Logf("%d reads through a %s on another node while a wrote %d records", reads, via, records)
}

// TestTwoMountsSeeEachOthersChanges: two mounts of one cluster, through
// different nodes, have one file open; each change one makes (a write past
// the end, a truncate up or down) is seen by the other's very next read
// and stat, whichever mount made it. The change events of the other
// mount's commits arrive while the reader's kernel waits for the file's
// attributes; an invalidation then would make the kernel throw the fresh
// attributes away and end the read at the old size.
func TestTwoMountsSeeEachOthersChanges(t *testing.T) {
	if testSync {
		t.Skip("with --sync, write-behind is close-to-open: a reader sees a file's writes once it is closed or synced")
	}
	if testBinding == BindingBazil {
		t.Skip("bazil.org/fuse cannot ask for FUSE_AUTO_INVAL_DATA: its kernel keeps pages until a change event invalidates them, and that invalidation races the reader's GETATTR (docs/fuse.md, \"Capabilities\")")
	}
	cl := startCluster(t, 3)
	addrs := cl.APIAddrs()
	a := mountOn(t, addrs[:1], Options{})
	b := mountOn(t, addrs[2:3], Options{})
	require.NoError(t, os.Mkdir(filepath.Join(a.Dir(), "d"), 0o755))
	fa, err := os.OpenFile(filepath.Join(a.Dir(), "d", "f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer fa.Close()
	fb, err := os.OpenFile(filepath.Join(b.Dir(), "d", "f"), os.O_RDWR, 0)
	require.NoError(t, err)
	defer fb.Close()

	files := [2]*os.File{fa, fb}
	size := int64(0)
	for i := range 60 {
		w, r := files[i%2], files[(i+1)%2]
		switch i % 3 {
		case 0: // a write past the end
			data := bytes.Repeat([]byte{byte('a' + i%26)}, 3000)
			_, err := w.WriteAt(data, size+1000)
			require.NoError(t, err)
			size += 4000
			got := make([]byte, 5000)
			n, err := r.ReadAt(got, size-3000)
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, data, got[:n], "change %d: read through the other mount", i)
		case 1: // a truncate up
			size += 5000
			require.NoError(t, w.Truncate(size))
			got := make([]byte, 8000)
			n, _ := r.ReadAt(got, size-5000)
			require.Equal(t, 5000, n, "change %d: read of the hole through the other mount", i)
		case 2: // a truncate down
			size -= 2000
			require.NoError(t, w.Truncate(size))
		}
		st, err := r.Stat()
		require.NoError(t, err)
		require.Equal(t, size, st.Size(), "change %d: size through the other mount", i)
	}
}
