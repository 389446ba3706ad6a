package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// valve holds back whoever waits on it while it is shut.
type valve struct {
	mu   sync.Mutex
	shut chan struct{} // closed when waiters may go on; nil: open
}

func (v *valve) wait() {
	v.mu.Lock()
	ch := v.shut
	v.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (v *valve) shutOff() {
	v.mu.Lock()
	v.shut = make(chan struct{})
	v.mu.Unlock()
}

func (v *valve) open() {
	v.mu.Lock()
	close(v.shut)
	v.shut = nil
	v.mu.Unlock()
}

// stallingLog is a Raft log store whose writes can be held back (its valve
// shut), as a disk that stalls holds back the leader's log.
type stallingLog struct {
	raft.LogStore
	valve
}

func (s *stallingLog) StoreLog(l *raft.Log) error { s.wait(); return s.LogStore.StoreLog(l) }

func (s *stallingLog) StoreLogs(ls []*raft.Log) error { s.wait(); return s.LogStore.StoreLogs(ls) }

// TestSessionSurvivesStalledLog: the leader's log store stalls for four
// leases while the client's keepalives, and one of its writes, queue at
// the leader. When the log moves again the session is still there and its
// handle still works: a renewal counts from when it reached the leader's
// queue, not from when its entry formed after the stall.
func TestSessionSurvivesStalledLog(t *testing.T) {
	const lease = time.Second
	log := &stallingLog{LogStore: raft.NewInmemStore()}
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Stores = &server.Stores{Log: log, Stable: raft.NewInmemStore()}
	}))
	cl := connect(t, c, client.WithLease(lease))
	writeAcross(t, cl, 4*lease, log.shutOff, log.open)
}

// writeAcross writes to a file before, during and after a stop of
// length d (between stop and resume) and checks that the session and
// its handle lived through it and that every write is in the file.
func writeAcross(t *testing.T, cl *client.Client, d time.Duration, stop, resume func()) {
	t.Helper()
	f, err := cl.Create("/held")
	require.NoError(t, err)
	_, err = f.Write([]byte("before "))
	require.NoError(t, err)
	old := cl.Session()

	stop()
	written := make(chan error, 1)
	go func() {
		_, err := f.Write([]byte("during "))
		written <- err
	}()
	time.Sleep(d) // the stop itself: nothing is polled meanwhile
	resume()

	require.NoError(t, <-written)
	_, err = f.Write([]byte("after"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, old, cl.Session())
	data, err := cl.ReadFile("/held")
	require.NoError(t, err)
	require.Equal(t, "before during after", string(data))
}

// freezer dials connections of which the first to each address (the one
// the client's own commands go on) can be frozen: nothing it carries moves
// either way, as when megabytes of writes fill its buffers.
type freezer struct {
	valve // shut while frozen
	mu    sync.Mutex
	first map[string]*frozenConn
}

func newFreezer() *freezer { return &freezer{first: map[string]*frozenConn{}} }

func (f *freezer) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := client.DialAddr(ctx, addr)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.first[addr]; ok {
		return conn, nil
	}
	fc := &frozenConn{Conn: conn, f: f}
	f.first[addr] = fc
	return fc, nil
}

type frozenConn struct {
	net.Conn
	f *freezer
}

func (c *frozenConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.f.wait() // what arrived waits for the thaw
	return n, err
}

func (c *frozenConn) Write(p []byte) (int, error) {
	c.f.wait()
	return c.Conn.Write(p)
}

// TestSessionSurvivesFrozenConnection: the connection the client's
// commands go on carries nothing for four leases (one of its writes waits
// in it); the session lives on, renewed on a connection of its own, and
// the handle works once the connection moves again.
func TestSessionSurvivesFrozenConnection(t *testing.T) {
	const lease = time.Second
	c := servertest.StartCluster(t, 1, servertest.WithEphemeral())
	fr := newFreezer()
	cl := connect(t, c, client.WithLease(lease), client.WithDialer(fr.dial),
		client.WithAttemptTimeout(20*time.Second), client.WithRetryTimeout(30*time.Second))
	writeAcross(t, cl, 4*lease, fr.shutOff, fr.open)
}

// TestSessionSurvivesLeaderlessGap: two of three nodes are down for more
// than two leases, so there is no leader, and the client is cut off from
// the cluster. The new leader's first entry (here another client's mkdir)
// renews every session, so the client's session is still there when it
// reaches the cluster again, and its handle works.
func TestSessionSurvivesLeaderlessGap(t *testing.T) {
	const lease = 2 * time.Second
	c := servertest.StartCluster(t, 3)
	g := &gate{}
	cl := connect(t, c, client.WithLease(lease), client.WithDialer(g.dial))
	observer := connect(t, c)
	f, err := cl.Create("/held")
	require.NoError(t, err)
	_, err = f.Write([]byte("before "))
	require.NoError(t, err)
	old := cl.Session()

	g.set(true)
	c.Kill(0)
	c.Kill(1)
	time.Sleep(5 * lease / 2) // the gap itself: no leader for two and a half leases
	c.Restart(0)
	c.Restart(1)
	require.NoError(t, observer.Mkdir("/after-gap", 0o755)) // an entry of the new leader
	st, err := observer.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, int(st.Sessions), "the cut-off client's session ended at the new leader's first entry")
	g.set(false)

	_, err = f.Write([]byte("after"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, old, cl.Session())
	data, err := cl.ReadFile("/held")
	require.NoError(t, err)
	require.Equal(t, "before after", string(data))
}
