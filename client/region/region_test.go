package region_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/region"
	"github.com/memoryfs/memfs/server/servertest"
)

func connect(t *testing.T, cl *servertest.Cluster, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cl.APIAddrs(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pattern is n bytes that differ in every chunk.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/7) ^ seed ^ byte(i>>16)
	}
	return b
}

func open(t *testing.T, c *client.Client, path string, opts region.Options) *region.Region {
	t.Helper()
	r, err := region.Open(t.Context(), c, path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestRegionReadWriteSync: reads fetch on demand and in the background;
// writes stay local until pushed; Sync commits them; another client's
// read recalls the capability, which pushes first, and the region takes
// it back for its next write.
func TestRegionReadWriteSync(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	data := pattern(20<<16+123, 1)
	require.NoError(t, plain.WriteFile("/r", data, 0o644))

	var mu sync.Mutex
	var reports []region.Progress
	r := open(t, connect(t, cl, client.WithCaps()), "/r", region.Options{Workers: 2, ProgressInterval: 10 * time.Millisecond,
		Progress: func(p region.Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() }})
	require.EqualValues(t, len(data), r.Size())

	got := make([]byte, 1000)
	n, err := r.ReadAt(got, 5<<16+10)
	require.NoError(t, err)
	require.Equal(t, 1000, n)
	require.Equal(t, data[5<<16+10:5<<16+1010], got)
	require.NoError(t, r.Wait(t.Context()))
	all := make([]byte, len(data))
	_, err = r.ReadAt(all, 0)
	require.NoError(t, err)
	require.Equal(t, data, all)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reports) > 0 && reports[len(reports)-1].Local == r.Size()
	}, 10*time.Second, 10*time.Millisecond)

	// A read at the end is short.
	n, err = r.ReadAt(got, r.Size()-10)
	require.Equal(t, 10, n)
	require.Error(t, err)

	// Writes: partial chunks, across a boundary, and past the end.
	_, err = r.WriteAt([]byte("hello"), 3)
	require.NoError(t, err)
	_, err = r.WriteAt(bytes.Repeat([]byte("x"), 1<<16), 7<<16+100)
	require.NoError(t, err)
	copy(data[3:], "hello")
	copy(data[7<<16+100:], bytes.Repeat([]byte("x"), 1<<16))
	_, err = r.WriteAt([]byte("no"), r.Size()-1)
	require.Error(t, err)
	require.NoError(t, r.Sync(t.Context()))

	// The plain client's read recalls the capability: it sees the writes.
	b, err := plain.ReadFile("/r")
	require.NoError(t, err)
	require.Equal(t, data, b)

	// The region takes its capability back for the next write.
	_, err = r.WriteAt([]byte("again"), 100)
	require.NoError(t, err)
	copy(data[100:], "again")
	require.NoError(t, r.Sync(t.Context()))
	b, err = plain.ReadFile("/r")
	require.NoError(t, err)
	require.Equal(t, data, b)

	// Another client's write lands; the region sees it after taking the
	// capability back.
	_, err = r.WriteAt([]byte("mine"), 0)
	require.NoError(t, err)
	f, err := plain.OpenFile("/r", 2, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("theirs"), 9<<16)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	copy(data, "mine")
	copy(data[9<<16:], "theirs")
	_, err = r.ReadAt(all, 0)
	require.NoError(t, err)
	require.Equal(t, data, all)
}

// TestRegionMovesOnlyChanges: a chunk rewritten with its own content is
// not sent, and chunks the region or a shared cache already has by hash
// are not fetched.
func TestRegionMovesOnlyChanges(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	same := bytes.Repeat(pattern(1<<16, 3), 8) // eight identical chunks
	require.NoError(t, plain.WriteFile("/same", same, 0o644))

	cache := region.MemCache(64 << 20)
	c := connect(t, cl, client.WithCaps())
	r := open(t, c, "/same", region.Options{Cache: cache})
	require.NoError(t, r.Wait(t.Context()))
	require.EqualValues(t, 1<<16, r.Progress().Pulled, "one chunk fetched for eight")

	_, err := r.WriteAt(same[:3<<16], 0)
	require.NoError(t, err)
	require.NoError(t, r.Sync(t.Context()))
	require.Zero(t, r.Progress().Pushed, "unchanged chunks travel not")
	_, err = r.WriteAt([]byte("changed"), 1<<16)
	require.NoError(t, err)
	require.NoError(t, r.Sync(t.Context()))
	require.EqualValues(t, len("changed"), r.Progress().Pushed, "only the bytes written travel, not their chunk")
	require.NoError(t, r.Close())

	// Another region through the same cache fetches nothing it has.
	r2 := open(t, c, "/same", region.Options{Cache: cache})
	require.NoError(t, r2.Wait(t.Context()))
	require.Zero(t, r2.Progress().Pulled)
	got := make([]byte, 7)
	_, err = r2.ReadAt(got, 1<<16)
	require.NoError(t, err)
	require.Equal(t, "changed", string(got))
}

// TestRegionBytesView: writes through Bytes are found by their hash at
// Sync, or named with MarkDirty.
func TestRegionBytesView(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/v", pattern(4<<16, 5), 0o644))
	c := connect(t, cl, client.WithCaps())
	r := open(t, c, "/v", region.Options{})
	mem := r.Bytes()
	require.NoError(t, r.Fetch(t.Context(), 0, 2<<16))
	copy(mem[10:], "through the view")
	require.NoError(t, r.Sync(t.Context()))
	b, err := plain.ReadFile("/v")
	require.NoError(t, err)
	require.Equal(t, "through the view", string(b[10:26]))

	require.NoError(t, r.Wait(t.Context()))
	copy(mem[3<<16:], "marked")
	r.MarkDirty(3<<16, 6)
	require.NoError(t, r.Sync(t.Context()))
	b, err = plain.ReadFile("/v")
	require.NoError(t, err)
	require.Equal(t, "marked", string(b[3<<16:3<<16+6]))
}

// killable is a dialer whose connections can all be cut at once, and
// stay cut: a host that died.
type killable struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (k *killable) dial(ctx context.Context, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errors.New("host is dead")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		k.conns = append(k.conns, conn)
	}
	return conn, err
}

func (k *killable) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
}

// counter writes an increasing counter into every chunk of r in turn,
// until stop; it returns the last value written into each chunk.
func counter(t *testing.T, r *region.Region, stop <-chan struct{}, done chan<- []uint64) {
	chunks := int(r.Size() / int64(r.ChunkSize()))
	last := make([]uint64, chunks)
	for v := uint64(1); ; v++ {
		select {
		case <-stop:
			done <- last
			return
		default:
		}
		i := int(v) % chunks
		var b [8]byte
		putU64(b[:], v)
		if _, err := r.WriteAt(b[:], int64(i)*int64(r.ChunkSize())); err != nil {
			done <- last
			return
		}
		last[i] = v
	}
}

func putU64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func getU64(b []byte) uint64 {
	var v uint64
	for i := range 8 {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}

// TestHandoff: B pulls while A writes; A's Finalize moves the capability
// in one command; B holds every write A made, and A's later writes fail.
func TestHandoff(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/h", pattern(32<<16, 7), 0o644))
	a := open(t, connect(t, cl, client.WithCaps()), "/h", region.Options{})
	stop, done := make(chan struct{}), make(chan []uint64, 1)
	go counter(t, a, stop, done)

	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/h", region.Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.Progress().Local == l.Progress().Size }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, l.Ready(t.Context()))
	_, err = a.WaitLeecher(t.Context(), true)
	require.NoError(t, err)

	var b *region.Region
	var takeErr error
	took := make(chan struct{})
	go func() { b, takeErr = l.Take(t.Context()); close(took) }()
	hs, err := a.Finalize(t.Context())
	require.NoError(t, err)
	close(stop)
	last := <-done
	<-took
	require.NoError(t, takeErr)
	t.Cleanup(func() { _ = b.Close() })
	require.Equal(t, bc.Session(), hs.To)

	_, err = a.WriteAt([]byte("late"), 0)
	require.ErrorIs(t, err, region.ErrHandedOff)
	buf := make([]byte, 8)
	for i, v := range last {
		_, err := b.ReadAt(buf, int64(i)*int64(b.ChunkSize()))
		require.NoError(t, err)
		if v != 0 {
			require.Equal(t, v, getU64(buf), "chunk %d", i)
		}
	}
	_, err = b.WriteAt([]byte("B's turn"), 0)
	require.NoError(t, err)
	require.NoError(t, b.Sync(t.Context()))
	got, err := plain.ReadFile("/h")
	require.NoError(t, err)
	require.Equal(t, "B's turn", string(got[:8]))
}

// TestWriterLearnsHandoffAtOnce: a write on the old holder returns
// ErrHandedOff at once while the holder gives its memory back (tens of
// milliseconds for a large region, which the application's pause would
// count if the write waited for it).
func TestWriterLearnsHandoffAtOnce(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/f", pattern(8<<16, 3), 0o644))
	a := open(t, connect(t, cl, client.WithCaps()), "/f", region.Options{})
	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/f", region.Options{})
	require.NoError(t, err)
	require.NoError(t, l.Ready(t.Context()))
	_, err = a.WaitLeecher(t.Context(), true)
	require.NoError(t, err)

	var whileFreeing error
	var once sync.Once // the old holder's memory; not the new one's at cleanup
	region.SetBeforeUnmap(t, func() {
		once.Do(func() {
			wrote := make(chan error, 1)
			go func() {
				_, err := a.WriteAt([]byte("late"), 0)
				wrote <- err
			}()
			select {
			case whileFreeing = <-wrote:
			case <-time.After(10 * time.Second):
				whileFreeing = errors.New("a write waited for the holder to free its memory")
			}
		})
	})
	var b *region.Region
	took := make(chan error, 1)
	go func() {
		var err error
		b, err = l.Take(t.Context())
		took <- err
	}()
	_, err = a.Finalize(t.Context())
	require.NoError(t, err)
	require.NoError(t, <-took)
	t.Cleanup(func() { _ = b.Close() })
	require.ErrorIs(t, whileFreeing, region.ErrHandedOff)
}

// TestHandoffCarriesLastWrites: what the holder wrote and had not pushed
// at the freeze travels in the handoff command itself, only the bytes
// written, and the new holder reads it.
func TestHandoffCarriesLastWrites(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/w", pattern(8<<16, 5), 0o644))
	// No push before the finalize: the writes wait for it.
	a := open(t, connect(t, cl, client.WithCaps()), "/w", region.Options{PushInterval: time.Hour})
	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/w", region.Options{})
	require.NoError(t, err)
	require.NoError(t, l.Ready(t.Context()))
	_, err = a.WaitLeecher(t.Context(), true)
	require.NoError(t, err)
	writes := map[int64]string{5: "one", 3<<16 + 100: "two", 3<<16 + 200: "three", 7<<16 + 1: "four"}
	n := 0
	for off, s := range writes {
		_, err := a.WriteAt([]byte(s), off)
		require.NoError(t, err)
		n += len(s)
	}
	require.Zero(t, a.Progress().Pushed)

	var b *region.Region
	var takeErr error
	took := make(chan struct{})
	go func() { b, takeErr = l.Take(t.Context()); close(took) }()
	hs, err := a.Finalize(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, n, hs.Final, "the handoff carries the bytes written")
	require.EqualValues(t, n, hs.Pushed, "nothing was pushed before it")
	<-took
	require.NoError(t, takeErr)
	t.Cleanup(func() { _ = b.Close() })
	want := pattern(8<<16, 5)
	for off, s := range writes {
		copy(want[off:], s)
	}
	got := make([]byte, len(want))
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, want, got)
	got, err = plain.ReadFile("/w")
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// TestHandoffReportsChanged: the handoff tells the new holder which
// chunks changed since it registered, exactly those the holder wrote
// since, and it fetches only those again instead of reading every hash.
func TestHandoffReportsChanged(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	const chunks = 16
	require.NoError(t, plain.WriteFile("/r", pattern(chunks<<16, 13), 0o644))
	a := open(t, connect(t, cl, client.WithCaps()), "/r", region.Options{})
	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/r", region.Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.Progress().Local == l.Progress().Size }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, l.Ready(t.Context()))
	_, err = a.WaitLeecher(t.Context(), true)
	require.NoError(t, err)
	for _, i := range []int64{2, 9} {
		_, err = a.WriteAt([]byte("changed"), i<<16+100)
		require.NoError(t, err)
	}
	// The holder's watch has seen the leecher: the writes count for it.
	require.Eventually(t, func() bool { return a.Progress().DirtySinceLeech == 2<<16 }, 30*time.Second, 10*time.Millisecond)
	pulled := l.Progress().Pulled

	var b *region.Region
	var takeErr error
	took := make(chan struct{})
	go func() { b, takeErr = l.Take(t.Context()); close(took) }()
	_, err = a.Finalize(t.Context())
	require.NoError(t, err)
	<-took
	require.NoError(t, takeErr)
	t.Cleanup(func() { _ = b.Close() })
	taken := l.Taken()
	require.True(t, taken.Reported, "the handoff listed what changed")
	require.Equal(t, 2, taken.Changed)
	require.False(t, taken.Seen.After(taken.Trusted) || taken.Trusted.After(taken.Ready), "seen, trusted, ready in that order: %+v", taken)
	got := make([]byte, chunks<<16)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	want, err := plain.ReadFile("/r")
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, "changed", string(got[9<<16+100:9<<16+107]))
	require.EqualValues(t, 2<<16, b.Progress().Pulled-pulled, "only the two changed chunks fetched again")
}

// TestHandoffHolderDies: the holder dies before it finalizes; the
// leecher gets the capability once the holder's lease ran out, with at
// least what the holder synced.
func TestHandoffHolderDies(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/d", pattern(8<<16, 9), 0o644))
	k := &killable{}
	// The dead host's calls give up soon: its Close comes after its death.
	ac := connect(t, cl, client.WithCaps(), client.WithLease(2*time.Second), client.WithDialer(k.dial), client.WithRetryTimeout(time.Second))
	a, err := region.Open(t.Context(), ac, "/d", region.Options{})
	require.NoError(t, err)
	_, err = a.WriteAt([]byte("synced!!"), 0)
	require.NoError(t, err)
	require.NoError(t, a.Sync(t.Context()))

	bc := connect(t, cl, client.WithCaps())
	l, err := region.Leech(t.Context(), bc, "/d", region.Options{})
	require.NoError(t, err)
	k.kill()
	start := time.Now()
	b, err := l.Take(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	t.Logf("took over %v after the holder died", time.Since(start))
	got := make([]byte, 8)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "synced!!", string(got))
	_, err = b.WriteAt([]byte("B"), 1<<16)
	require.NoError(t, err)
	require.NoError(t, b.Sync(t.Context()))
	require.NoError(t, a.Close(), "nothing was left to commit")
}

// TestHandoffLeecherDies: the leecher's session ends before the
// finalize; the holder keeps its capability and goes on writing.
func TestHandoffLeecherDies(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	plain := connect(t, cl)
	require.NoError(t, plain.WriteFile("/l", pattern(8<<16, 11), 0o644))
	a := open(t, connect(t, cl, client.WithCaps()), "/l", region.Options{})
	bc, err := client.New(t.Context(), cl.APIAddrs(), client.WithCaps())
	require.NoError(t, err)
	_, err = region.Leech(t.Context(), bc, "/l", region.Options{})
	require.NoError(t, err)
	_, err = a.WaitLeecher(t.Context(), false)
	require.NoError(t, err)
	require.NoError(t, bc.Close()) // the leecher's host goes, and its session

	_, err = a.WriteAt([]byte("still mine"), 0)
	require.NoError(t, err)
	_, err = a.Finalize(t.Context())
	require.Error(t, err)
	_, err = a.WriteAt([]byte("STILL"), 0)
	require.NoError(t, err)
	require.NoError(t, a.Sync(t.Context()))
	got, err := plain.ReadFile("/l")
	require.NoError(t, err)
	require.Equal(t, "STILL mine", string(got[:10]))
}
