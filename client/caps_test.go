package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/proto"
	"github.com/memoryfs/memfs/server"
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
	cl := server.StartCluster(t, 3)
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
	cl := server.StartCluster(t, 3)
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
	cl := server.StartCluster(t, 1)
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
