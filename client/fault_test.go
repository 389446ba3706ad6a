package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// appendLog runs writers that append distinct records ("key:padding\n") to
// /log through O_APPEND files until stop is closed, and returns the key of
// every record that was acknowledged. A write applied twice would show as
// a duplicate record.
func appendLog(t *testing.T, cl *client.Client, writers int, stop <-chan struct{}, acked *atomic.Int64) []string {
	t.Helper()
	var mu sync.Mutex
	var done []string
	var wg sync.WaitGroup
	for w := range writers {
		f, err := cl.OpenFile("/log", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		require.NoError(t, err)
		wg.Go(func() {
			defer f.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Writer 0 makes records over one message, which go
				// through the Write stream.
				key := fmt.Sprintf("w%d-%d", w, i)
				rec := key + ":"
				if w == 0 {
					rec += strings.Repeat("x", pb.MaxMessageData+pb.MaxMessageData/4)
				}
				if _, err := f.Write([]byte(rec + "\n")); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				done = append(done, key)
				mu.Unlock()
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	return done
}

// checkLog verifies that every acknowledged record is in /log exactly once
// and nothing is there twice.
func checkLog(t *testing.T, cl *client.Client, acked []string) {
	t.Helper()
	data, err := cl.ReadFile("/log")
	require.NoError(t, err)
	seen := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if line != "" {
			key, _, ok := strings.Cut(line, ":")
			require.True(t, ok, "torn record %.40q", line)
			seen[key]++
		}
	}
	for rec, n := range seen {
		require.Equal(t, 1, n, "record %q applied %d times", rec, n)
	}
	for _, rec := range acked {
		require.Equal(t, 1, seen[rec], "acknowledged record %q missing", rec)
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, timeout, 5*time.Millisecond, what)
}

func TestKillLeaderDuringWrites(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	cl := connect(t, c)
	stop := make(chan struct{})
	var acked atomic.Int64
	var records []string
	var wg sync.WaitGroup
	wg.Go(func() { records = appendLog(t, cl, 4, stop, &acked) })

	waitFor(t, "writes before the kill", 20*time.Second, func() bool { return acked.Load() >= 40 })
	leader := c.WaitLeader(10 * time.Second)
	c.Kill(c.Index(leader))
	before := acked.Load()
	waitFor(t, "writes after the kill", 30*time.Second, func() bool { return acked.Load() >= before+80 })
	close(stop)
	wg.Wait()
	checkLog(t, cl, records)

	// A client connecting now finds the new leader too.
	other := connect(t, c)
	checkLog(t, other, records)
}

// flakyDialer returns connections that break after a random number of
// reads, so that requests and replies are lost at random points.
func flakyDialer(cut *atomic.Int64) client.Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := client.DialAddr(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &flakyConn{Conn: conn, left: 5 + rand.IntN(60), cut: cut}, nil
	}
}

type flakyConn struct {
	net.Conn
	mu   sync.Mutex
	left int
	cut  *atomic.Int64
}

func (f *flakyConn) Read(p []byte) (int, error) {
	f.mu.Lock()
	f.left--
	broken := f.left < 0
	f.mu.Unlock()
	if broken {
		f.cut.Add(1)
		_ = f.Conn.Close()
		return 0, errors.New("connection cut by test")
	}
	return f.Conn.Read(p)
}

func TestFlakyConnectionsApplyOnce(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	var cut atomic.Int64
	cl := connect(t, c, client.WithDialer(flakyDialer(&cut)))
	stop := make(chan struct{})
	var acked atomic.Int64
	var records []string
	var wg sync.WaitGroup
	wg.Go(func() { records = appendLog(t, cl, 4, stop, &acked) })
	waitFor(t, "writes through broken connections", 60*time.Second, func() bool {
		return acked.Load() >= 300 && cut.Load() >= 5
	})
	close(stop)
	wg.Wait()
	checkLog(t, connect(t, c), records)
}

// gate is a dialer whose connections can all be cut at once and refused
// until it opens again: the client is partitioned from the cluster.
type gate struct {
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (g *gate) dial(ctx context.Context, addr string) (net.Conn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errors.New("partitioned by test")
	}
	conn, err := client.DialAddr(ctx, addr)
	if err == nil {
		g.conns = append(g.conns, conn)
	}
	return conn, err
}

func (g *gate) set(closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = closed
	if closed {
		for _, c := range g.conns {
			_ = c.Close()
		}
		g.conns = nil
	}
}

func TestSessionExpiry(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	g := &gate{}
	cl := connect(t, c, client.WithLease(time.Second), client.WithDialer(g.dial),
		client.WithRetryTimeout(time.Second))
	observer := connect(t, c)
	f, err := cl.Create("/held")
	require.NoError(t, err)
	_, err = f.Write([]byte("before"))
	require.NoError(t, err)
	old := cl.Session()

	// Cut the client off for longer than its lease: the cluster expires
	// the session on log time (the leader's ticks keep the log moving).
	g.set(true)
	waitFor(t, "session expiry", 20*time.Second, func() bool {
		st, err := observer.Status(t.Context())
		return err == nil && st.Sessions == 1
	})
	g.set(false)

	// The file's handle belonged to the expired session.
	_, err = f.Write([]byte("after"))
	require.ErrorIs(t, err, syscall.ESTALE)
	require.ErrorIs(t, f.Close(), syscall.ESTALE)
	// Path operations go on in a new session.
	require.NoError(t, cl.WriteFile("/new", []byte("ok"), 0o644))
	require.NotEqual(t, old, cl.Session())
	data, err := cl.ReadFile("/held")
	require.NoError(t, err)
	require.Equal(t, "before", string(data))
}

func TestWatch(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	cl := connect(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := cl.Watch(ctx)
	require.NoError(t, err)
	require.NoError(t, cl.Mkdir("/watched", 0o755))
	fi, err := cl.Stat("/watched")
	require.NoError(t, err)
	ino := fi.Sys().(*pb.Attr).Ino
	timeout := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case ev := <-events:
			for _, d := range ev.Entries {
				found = found || d.Name == "watched"
			}
			for _, i := range ev.Inodes {
				found = found || i == ino
			}
		case <-timeout:
			t.Fatal("no watch event for the new directory")
		}
	}
	cancel()
	for range events {
		// Drain until Watch closes the channel.
	}
}

func TestUnixSocket(t *testing.T) {
	dir := t.TempDir()
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral(), servertest.WithNodeConfig(func(i int, cfg *server.Config) {
		cfg.UnixSocket = filepath.Join(dir, fmt.Sprintf("n%d.sock", i))
	}))
	_ = c
	cl, err := client.New(t.Context(), []string{"unix://" + filepath.Join(dir, "n0.sock")})
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.WriteFile("/u", []byte("unix"), 0o644))
	data, err := cl.ReadFile("/u")
	require.NoError(t, err)
	require.True(t, bytes.Equal([]byte("unix"), data))
	_, err = cl.Stat("/nope")
	require.ErrorIs(t, err, fs.ErrNotExist)
}
