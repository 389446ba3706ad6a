package fuse

import (
	"bytes"
	"fmt"
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
// while a client of another node reads it again and again. Each read
// recalls a's capability, and a commits what it acknowledged before giving
// it back, so every read holds at least every record whose write returned
// before the read began, in order. (The reader is a client, not a second
// mount: read through another FUSE mount, about one read in a thousand
// still comes back a record or two short; see docs/fuse.md, "Buffered
// metadata".)
func TestReaderSeesWriterStillWriting(t *testing.T) {
	if testSync {
		t.Skip("with --sync, write-behind is close-to-open: a reader sees a file's writes once it is closed or synced")
	}
	cl := startCluster(t, 3)
	addrs := cl.APIAddrs()
	a := mountOn(t, addrs[:1], Options{})
	reader := newClient(t, addrs[1:2])
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
		within(t, 30*time.Second, "read by another client", func() error {
			got, err = reader.ReadFile("/d/log")
			return err
		})
		require.GreaterOrEqual(t, int64(len(got)), before*size, "read %d: %d records written before it began", reads, before)
		for i := int64(0); i < before; i++ {
			require.Equal(t, record(int(i)), got[i*size:(i+1)*size], "record %d", i)
		}
	}
	t.Logf("%d reads by another client while a wrote %d records", reads, records)
}
