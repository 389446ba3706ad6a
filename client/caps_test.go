package client_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

// putIno writes data to p and returns p's inode number.
func putIno(t testing.TB, c *client.Client, p, data string) uint64 {
	t.Helper()
	require.NoError(t, c.WriteFile(p, []byte(data), 0o644))
	st, err := c.Stat(p)
	require.NoError(t, err)
	return st.Sys().(*pb.Attr).Ino
}

// TestCapabilityRecalledByWriter: a holder's capability is recalled
// through its change stream when another client writes; the holder's
// OnRecall runs before the write is applied, and the write waits for it.
func TestCapabilityRecalledByWriter(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	holder := connect(t, cl, client.WithCaps())
	writer := connect(t, cl)
	ctx := t.Context()
	ino := putIno(t, writer, "/f", "one")

	caps := holder.Caps()
	require.NotNil(t, caps)
	var mu sync.Mutex
	var recalled []uint64
	var sawBefore string
	caps.OnRecall(func(inos []uint64) {
		mu.Lock()
		defer mu.Unlock()
		recalled = append(recalled, inos...)
		// What the holder reads while it has not released yet is still
		// the old data: the writer waits for the release.
		b, err := holder.ReadFile("/f")
		if err == nil {
			sawBefore = string(b)
		}
	})
	granted, err := caps.Grant(ctx, []uint64{ino}, false)
	require.NoError(t, err)
	require.Equal(t, []uint64{ino}, granted)
	require.Eventually(t, func() bool { return caps.Held(ino) }, 10*time.Second, 10*time.Millisecond,
		"trusted once the stream passed the grant")

	require.NoError(t, writer.WriteFile("/f", []byte("two"), 0o644))
	require.False(t, caps.Held(ino))
	mu.Lock()
	require.Equal(t, []uint64{ino}, recalled)
	require.Equal(t, "one", sawBefore)
	mu.Unlock()
	require.Equal(t, 0, caps.Len())
}

// TestDeadHolderDelaysAtMostItsLease: a session that holds a capability
// and never answers recalls (a raw GrantCmd from a client without a
// capability table) delays a writer by about its lease, not forever.
func TestDeadHolderDelaysAtMostItsLease(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	const lease = 2 * time.Second
	holder := connect(t, cl, client.WithLease(lease))
	writer := connect(t, cl)
	ctx := t.Context()
	ino := putIno(t, writer, "/f", "one")
	res, err := holder.Do(ctx, &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{ino}}}})
	require.NoError(t, err)
	require.Equal(t, []uint64{ino}, res.Granted)

	start := time.Now()
	require.NoError(t, writer.WriteFile("/f", []byte("two"), 0o644))
	waited := time.Since(start)
	require.GreaterOrEqual(t, waited, lease-100*time.Millisecond, "the write did not wait for the capability")
	require.Less(t, waited, 3*lease)
	b, err := holder.ReadFile("/f")
	require.NoError(t, err)
	require.Equal(t, "two", string(b))
	// Fenced: the holder's late release of the revoked capability
	// releases nothing.
	res, err = holder.Do(ctx, &pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: []*pb.CapRef{{Ino: ino, Epoch: res.Epoch}}}}})
	require.NoError(t, err)
	require.Zero(t, res.N)
}

// TestCapabilityTrustLapses: a holder whose change stream stops being
// proved current (here: the client is closed, so no renewal is seen)
// stops trusting its capabilities within its lease.
func TestCapabilityTrustLapses(t *testing.T) {
	cl := servertest.StartCluster(t, 1)
	const lease = time.Second
	holder := connect(t, cl, client.WithCaps(), client.WithLease(lease))
	require.NoError(t, holder.WriteFile("/f", nil, 0o644))
	caps := holder.Caps()
	_, err := caps.Grant(context.Background(), []uint64{1}, true)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return caps.Held(1) }, 10*time.Second, 10*time.Millisecond)
	cl.Stop(0)
	start := time.Now()
	require.Eventually(t, func() bool { return !caps.Held(1) }, 2*lease, 10*time.Millisecond)
	require.Less(t, time.Since(start), lease)
}

// blackhole is a dialer whose connections to one address can be made to
// swallow everything, both ways, without breaking: a node cut off with no
// reset, as a disconnected network leaves it.
type blackhole struct {
	mu    sync.Mutex
	conns map[string][]*holeConn
}

type holeConn struct {
	net.Conn
	cut atomic.Bool
}

func (c *holeConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.cut.Load() {
			return n, err
		}
	}
}

func (c *holeConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (h *blackhole) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := client.DialAddr(ctx, addr)
	if err != nil {
		return nil, err
	}
	hc := &holeConn{Conn: c}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns[addr] = append(h.conns[addr], hc)
	return hc, nil
}

// cut swallows everything on the connections made to addr so far.
func (h *blackhole) cut(addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns[addr] {
		c.cut.Store(true)
	}
}

// TestSilentStreamReopened: a holder whose change stream goes silent
// without breaking (its node's connection swallows everything) while its
// commands are answered through another node sees that the stream is
// behind, opens another and gives its capabilities back, so a writer
// does not wait for the cluster to revoke them after the holder's long
// lease.
func TestSilentStreamReopened(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	const lease = 30 * time.Second
	h := &blackhole{conns: map[string][]*holeConn{}}
	addrs := cl.APIAddrs()
	ctx := t.Context()
	holder, err := client.New(ctx, addrs, client.WithCaps(), client.WithLease(lease),
		client.WithDialer(h.dial), client.WithAttemptTimeout(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	writer := connect(t, cl)
	ino := putIno(t, writer, "/f", "one")

	caps := holder.Caps()
	lost := make(chan uint64, 16)
	caps.OnRecall(func(inos []uint64) {
		for _, i := range inos {
			lost <- i
		}
	})
	_, err = caps.Grant(ctx, []uint64{ino}, false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return caps.Held(ino) }, 10*time.Second, 10*time.Millisecond)

	// Every connection made so far goes silent; the client dialed only
	// the first address, so its commands go on through the others.
	h.mu.Lock()
	t.Logf("dialed %d of %d addresses", len(h.conns), len(addrs))
	h.mu.Unlock()
	for _, a := range addrs {
		h.cut(a)
	}
	require.NoError(t, holder.WriteFile("/g", []byte("renews"), 0o644))
	select {
	case i := <-lost:
		require.Equal(t, ino, i)
	case <-time.After(lease / 2):
		t.Fatal("the silent stream was not replaced")
	}
	start := time.Now()
	require.NoError(t, writer.WriteFile("/f", []byte("two"), 0o644))
	require.Less(t, time.Since(start), lease/2, "the write waited for revocation, not a release")
}

// TestExclusiveCapability: an exclusive grant recalls the other
// sessions' capabilities and waits for them; while it is held, another
// session's grant recalls it in turn.
func TestExclusiveCapability(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	a := connect(t, cl, client.WithCaps())
	b := connect(t, cl, client.WithCaps())
	ctx := t.Context()
	ino := putIno(t, a, "/f", "one")
	lost := func(c *client.Client) chan uint64 {
		ch := make(chan uint64, 8)
		c.Caps().OnRecall(func(inos []uint64) {
			for _, i := range inos {
				ch <- i
			}
		})
		return ch
	}
	lostA, lostB := lost(a), lost(b)
	trusted := func(c *client.Client, ino uint64, excl bool) func() bool {
		return func() bool {
			if excl {
				return c.Caps().HeldExclusive(ino)
			}
			return c.Caps().Held(ino)
		}
	}

	_, err := a.Caps().Grant(ctx, []uint64{ino}, false)
	require.NoError(t, err)
	require.Eventually(t, trusted(a, ino, false), 10*time.Second, 10*time.Millisecond)
	require.False(t, a.Caps().HeldExclusive(ino), "granted shared")

	granted, err := b.Caps().GrantExclusive(ctx, ino)
	require.NoError(t, err)
	require.Equal(t, []uint64{ino}, granted)
	require.Equal(t, ino, <-lostA, "the shared holder was recalled first")
	require.False(t, a.Caps().Held(ino))
	require.Eventually(t, trusted(b, ino, true), 10*time.Second, 10*time.Millisecond)

	_, err = a.Caps().Grant(ctx, []uint64{ino}, false)
	require.NoError(t, err)
	require.Equal(t, ino, <-lostB, "a shared grant recalls the exclusive one")
	require.False(t, b.Caps().HeldExclusive(ino))
	require.Eventually(t, trusted(a, ino, false), 10*time.Second, 10*time.Millisecond)
}

// TestGrantBeforeStreamNotHeld: a capability granted before the change
// stream (re)began is given back, not held: recalls between the grant and
// the stream's first event were never delivered, so the holder could not
// know it had to drop what it cached.
func TestGrantBeforeStreamNotHeld(t *testing.T) {
	cl := servertest.StartCluster(t, 1)
	holder := connect(t, cl, client.WithCaps())
	ctx := t.Context()
	require.NoError(t, holder.Mkdir("/d", 0o755))
	caps := holder.Caps()
	st, err := holder.Stat("/d")
	require.NoError(t, err)
	d := st.Sys().(*pb.Attr).Ino
	_, err = caps.Grant(ctx, []uint64{d}, false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return caps.Held(d) }, 10*time.Second, 10*time.Millisecond)

	// A create in the held directory hands out a capability at its epoch;
	// the stream is then taken to have begun after it.
	done := caps.Expect()
	res, err := holder.Do(ctx, &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{
		Loc: &pb.Loc{Path: "/d/sub"}, Mode: 0o755}}})
	require.NoError(t, err)
	require.NotZero(t, res.Epoch)
	caps.StreamBeganAt(res.Epoch + 1)
	caps.Adopt(res.Attr.Ino, res.Epoch)
	done()
	require.False(t, caps.Held(res.Attr.Ino), "adopted a capability whose recalls the stream cannot have carried")
}

// TestRecallBeforeFirstGrantAnswered: a recall naming the client's session
// that arrives while the session's first grant is still unanswered is not
// lost: the grant's capability, recalled already, is given back, not held
// (holding it would keep every other session's command on the inode
// waiting a lease).
func TestRecallBeforeFirstGrantAnswered(t *testing.T) {
	cl := servertest.StartCluster(t, 1)
	holder := connect(t, cl, client.WithCaps())
	ctx := t.Context()
	require.NoError(t, holder.Mkdir("/d", 0o755)) // opens the session
	st, err := holder.Stat("/d")
	require.NoError(t, err)
	d := st.Sys().(*pb.Attr).Ino
	caps := holder.Caps()
	require.NotZero(t, holder.Session())

	done := caps.Expect() // as while the grant below is on its way
	caps.Observe(&pb.WatchEvent{Index: 1, Recalls: []*pb.Recall{
		{Session: holder.Session(), Ino: d, Epoch: 1 << 40},
	}})
	_, err = caps.Grant(ctx, []uint64{d}, false)
	require.NoError(t, err)
	done()
	require.Zero(t, caps.Len(), "held a capability recalled before its grant was answered")
}
