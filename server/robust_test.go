package server_test

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestGarbageOnTheWireDoesNotHurt sends garbage and absurd length prefixes
// to the API and Raft ports; the nodes must keep serving.
func TestGarbageOnTheWireDoesNotHurt(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rng := rand.New(rand.NewPCG(1, 2))
	var payloads [][]byte
	// An HTTP/2 preface then a frame header claiming 16 MiB.
	payloads = append(payloads, append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1))
	// A gRPC message prefix claiming 4 GiB.
	huge := []byte{0}
	huge = binary.BigEndian.AppendUint32(huge, 0xffffffff)
	payloads = append(payloads, huge)
	// Raft RPC type byte followed by msgpack headers of enormous arrays/maps.
	payloads = append(payloads, []byte{0, 0xdd, 0xff, 0xff, 0xff, 0xff}, []byte{1, 0xdf, 0x7f, 0xff, 0xff, 0xff})
	for range 20 {
		b := make([]byte, 1+rng.IntN(4096))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		payloads = append(payloads, b)
	}
	for _, n := range c.Nodes() {
		for _, addr := range []string{n.APIAddr(), n.RaftAddr()} {
			for _, p := range payloads {
				conn, err := net.DialTimeout("tcp", addr, time.Second)
				require.NoError(t, err)
				_ = conn.SetDeadline(time.Now().Add(time.Second))
				_, _ = conn.Write(p)
				_ = conn.Close()
			}
		}
	}
	s := openSession(t, c.Client(follower(c, leader, 0).APIAddr()))
	s.mkdir("/still-fine")
	c.WaitApplied(c.WaitLeader(10*time.Second).AppliedIndex(), 10*time.Second)
	for _, n := range c.Nodes() {
		require.Zero(t, stat(t, c.Client(n.APIAddr()), "/still-fine", pb.Consistency_STALE).Errno)
	}
}

func TestMetricsAreRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) { cfg.Registerer = reg }))
	leader := c.WaitLeader(10 * time.Second)
	openSession(t, c.Client(leader.APIAddr())).mkdir("/m")
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{"memfs_server_commands_total", "memfs_server_apply_duration_seconds",
		"memfs_server_batch_commands", "memfs_server_raft_state", "memfs_server_fsm_inodes"} {
		require.True(t, got[name], name)
	}
	// A stopped node takes its metrics away, so a restart can register again.
	c.Kill(0)
	families, err = reg.Gather()
	require.NoError(t, err)
	require.Empty(t, families)
	c.Restart(0)
}

// TestInjectedTransportAndStoresSurviveRestart drives the injection points
// a fault-injection suite uses: its own raft.Transport and in-memory stores
// that outlive a crash.
func TestInjectedTransportAndStoresSurviveRestart(t *testing.T) {
	const n = 3
	trans := make([]*raft.InmemTransport, n)
	stores := make([]*server.Stores, n)
	for i := range n {
		_, trans[i] = raft.NewInmemTransport("")
		m := raft.NewInmemStore()
		stores[i] = &server.Stores{Log: m, Stable: m, Snapshots: raft.NewInmemSnapshotStore()}
	}
	connect := func(i int) {
		for j := range n {
			if i != j {
				trans[i].Connect(trans[j].LocalAddr(), trans[j])
				trans[j].Connect(trans[i].LocalAddr(), trans[i])
			}
		}
	}
	for i := range n {
		connect(i)
	}
	restarts := 0
	c := servertest.StartCluster(t, n,
		servertest.WithNodeConfig(func(i int, cfg *server.Config) { cfg.Transport, cfg.Stores = trans[i], stores[i] }),
		servertest.WithRestartConfig(func(i int, cfg *server.Config) {
			// Raft's Shutdown closed the old transport: a new one, same address.
			restarts++
			_, trans[i] = raft.NewInmemTransport(trans[i].LocalAddr())
			connect(i)
			cfg.Transport = trans[i]
		}))
	leader := c.WaitLeader(10 * time.Second)
	require.Equal(t, string(trans[c.Index(leader)].LocalAddr()), leader.RaftAddr())
	s := openSession(t, c.Client(leader.APIAddr()))
	s.create("/kept")
	s.write("/kept", 0, []byte("still here"))
	for i := range n {
		c.Kill(i)
	}
	for i := range n {
		c.Restart(i)
	}
	require.Equal(t, n, restarts)
	leader = c.WaitLeader(20 * time.Second)
	require.Equal(t, []byte("still here"), readAll(t, c.Client(leader.APIAddr()), "/kept", pb.Consistency_LINEARIZABLE))
}
