package region_test

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/region"
	"github.com/memoryfs/memfs/server/servertest"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// regionRegisters: the first 16 bytes of every chunk are one register of
// the model, written in halves of 8 bytes so that a chunk pushed with a
// stale half shows as a value going back.
const (
	regChunks = 8
	regLen    = 16
)

func regKey(i int) string { return fmt.Sprintf("c%02d", i) }

// regWriter writes unique tokens into random halves of the registers of
// r until stop or until the region refuses (handed off), recording every
// write that returned.
type regWriter struct {
	id    int
	tag   byte
	rng   *rand.Rand
	rec   *model.Recorder
	n     atomic.Int64
	fails []error
}

func (w *regWriter) run(r *region.Region, stop <-chan struct{}) error {
	cs := int64(r.ChunkSize())
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		i, half := w.rng.Intn(regChunks), w.rng.Intn(2)
		data := fmt.Sprintf("%c%07d", w.tag, w.n.Load())
		in := model.Input{Kind: model.KindWrite, Key: regKey(i), Off: int64(half * 8), Data: data}
		call := w.rec.Begin(w.id, in)
		n, err := r.WriteAt([]byte(data), int64(i)*cs+int64(half*8))
		switch {
		case errors.Is(err, region.ErrHandedOff):
			// Refused before it touched the region: no effect, and
			// nothing after it.
			call.Discard()
			return err
		case err != nil:
			call.End(model.Output{Unknown: true})
			return err
		}
		call.End(model.Output{N: int64(n)})
		w.n.Add(1)
		// A pace the checker can follow: thousands of writes, not
		// millions.
		time.Sleep(300 * time.Microsecond)
	}
}

// regRead reads register i through a plain client's open file.
func regRead(rec *model.Recorder, id int, f *client.File, cs int64, i int) error {
	in := model.Input{Kind: model.KindRead, Key: regKey(i), Len: regLen}
	call := rec.Begin(id, in)
	buf := make([]byte, regLen)
	n, err := f.ReadAt(buf, int64(i)*cs)
	if err != nil {
		call.Discard()
		return err
	}
	call.End(model.Output{Data: string(buf[:n])})
	return nil
}

// TestHandoffLinearizable: A writes into a region, B leeches and takes
// it over, B writes on; plain clients read the registers throughout
// (each read recalls the capability of whoever holds the region). Every
// write that returned must be seen by every read that began after it, in
// the order written: porcupine checks the history, one register per
// chunk.
func TestHandoffLinearizable(t *testing.T) {
	seed := workload.Seed(t)
	rng := rand.New(rand.NewSource(seed))
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	cs := int64(1 << 16)
	require.NoError(t, plain.WriteFile("/lin", make([]byte, regChunks*cs), 0o644))
	rec := model.NewRecorder()

	a := open(t, connect(t, cl, client.WithCaps()), "/lin", region.Options{})
	require.EqualValues(t, cs, a.ChunkSize(), "the test lays its registers out for 64 KiB blocks")
	for i := range regChunks {
		data := fmt.Sprintf("init%04d%08d", i, 0)
		call := rec.Begin(1, model.Input{Kind: model.KindWrite, Key: regKey(i), Data: data})
		n, err := a.WriteAt([]byte(data), int64(i)*cs)
		require.NoError(t, err)
		call.End(model.Output{N: int64(n)})
	}
	require.NoError(t, a.Sync(t.Context()))

	stopReads := make(chan struct{})
	var readers sync.WaitGroup
	var reads atomic.Int64
	for k := range 3 {
		f, err := connect(t, cl).OpenFile("/lin", os.O_RDONLY, 0)
		require.NoError(t, err)
		rrng := rand.New(rand.NewSource(seed + int64(k) + 1))
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer f.Close()
			for {
				select {
				case <-stopReads:
					return
				case <-time.After(time.Duration(5+rrng.Intn(15)) * time.Millisecond):
				}
				if regRead(rec, 10+k, f, cs, rrng.Intn(regChunks)) == nil {
					reads.Add(1)
				}
			}
		}()
	}

	wa := &regWriter{id: 1, tag: 'A', rng: rand.New(rand.NewSource(rng.Int63())), rec: rec}
	stopA, doneA := make(chan struct{}), make(chan error, 1)
	go func() {
		err := wa.run(a, stopA)
		if err != nil {
			t.Logf("A's writes end: %v", err)
		}
		doneA <- err
	}()
	waitCount := func(c *atomic.Int64, n int64) {
		require.Eventually(t, func() bool { return c.Load() >= n }, 30*time.Second, 5*time.Millisecond)
	}
	waitCount(&wa.n, 300)
	t.Logf("A: %d writes, %d reads", wa.n.Load(), reads.Load())

	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/lin", region.Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.Progress().Local == l.Progress().Size }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, l.Ready(t.Context()))
	// A writes on while B has everything and waits.
	waitCount(&wa.n, wa.n.Load()+200)

	var b *region.Region
	var takeErr error
	took := make(chan struct{})
	go func() { b, takeErr = l.Take(t.Context()); close(took) }()
	// Reads recall A's capability, which takes the leecher's
	// registration with it: the finalize may find none, or its
	// capability gone, and is tried again (B registers again).
	handedOff := false
	deadline := time.Now().Add(30 * time.Second)
	for try := 0; !handedOff; try++ {
		select {
		case <-took:
			require.NoError(t, takeErr)
			t.Logf("B took the region without a finalize (A's capability was recalled and B granted itself)")
			close(stopA)
			handedOff = true
			continue
		default:
		}
		hs, err := a.Finalize(t.Context())
		if err == nil {
			t.Logf("handed off after %d tries in %v, %d bytes pushed in the finalize", try+1, hs.Took, hs.Pushed)
			handedOff = true
			break
		}
		require.True(t, time.Now().Before(deadline), "finalize keeps failing: %v", err)
		time.Sleep(2 * time.Millisecond)
	}
	errA := <-doneA
	<-took
	require.NoError(t, takeErr)
	t.Cleanup(func() { _ = b.Close() })
	if errA != nil {
		require.ErrorIs(t, errA, region.ErrHandedOff, "A's writes end only by the handoff")
	}
	t.Logf("A wrote %d", wa.n.Load())

	wb := &regWriter{id: 2, tag: 'B', rng: rand.New(rand.NewSource(rng.Int63())), rec: rec}
	stopB, doneB := make(chan struct{}), make(chan error, 1)
	go func() { doneB <- wb.run(b, stopB) }()
	waitCount(&wb.n, 500)
	close(stopB)
	require.NoError(t, <-doneB)
	require.NoError(t, a.Close())
	require.NoError(t, b.Sync(t.Context()))
	close(stopReads)
	readers.Wait()

	// A final read of every register, after everything.
	f, err := plain.OpenFile("/lin", os.O_RDONLY, 0)
	require.NoError(t, err)
	for i := range regChunks {
		require.NoError(t, regRead(rec, 9, f, cs, i))
	}
	require.NoError(t, f.Close())
	t.Logf("B wrote %d, %d reads", wb.n.Load(), reads.Load())
	v := model.Check(t, seed, rec.Operations())
	require.Equal(t, porcupine.Ok, v.Result, "not checked to the end")
}
