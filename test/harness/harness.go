// Package harness runs a MemoryFS cluster of real server nodes inside the
// test process, with every Raft message and every client connection passing
// through a faultnet.Net, and nodes that can be crashed and restarted with
// their persisted state.
//
// Raft runs over hashicorp/raft's real TCP transport, wrapped by
// faultnet.Transport (so faults act on whole RPCs: loss, delay, reordering,
// duplication, partitions). Clients reach nodes through faultnet.Net.Dial
// (byte-stream faults: delay, reset, blackhole), and so do the nodes'
// connections to each other's APIs (a follower forwarding a client's
// request to the leader, block sync during a snapshot restore), through
// server.Config.PeerDialer.
//
// It is test code: nothing outside test/ may import it.
package harness

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/test/faultnet"
)

// Storage is where a node keeps its Raft state, which decides what a crash
// loses.
type Storage int

const (
	// Disk: raft-boltdb and file snapshots in a data dir, fsynced; a crash
	// loses nothing that was acknowledged.
	Disk Storage = iota
	// Memory: in-memory stores that the harness keeps across a crash (like
	// the 6.824 Persister): persistence without the disk.
	Memory
	// Ephemeral: in-memory stores lost with the node; a restarted node
	// comes back empty and is caught up by the others.
	Ephemeral
)

func (s Storage) String() string {
	return [...]string{"disk", "memory", "ephemeral"}[s]
}

// Options shape a cluster.
type Options struct {
	Nodes   int // 3 or 5
	Seed    int64
	Storage Storage
	// SnapshotThreshold and TrailingLogs, when not 0, replace the server's
	// defaults (a low threshold makes snapshots and their installation
	// happen under faults).
	SnapshotThreshold, TrailingLogs uint64
	// Tune adjusts every node's Raft settings last.
	Tune func(*server.RaftTuning)
}

// Cluster is a running in-process cluster.
type Cluster struct {
	T    testing.TB
	Net  *faultnet.Net
	opts Options
	dir  string

	ip string // every node binds on this loopback address (LoopbackIP)

	mu    sync.Mutex
	nodes []*slot
	skew  []atomic.Int64 // per node: added to its leader clock, in ns
}

type slot struct {
	id       string
	dataDir  string
	raftAddr string // fixed after the first start
	apiAddr  string
	node     *server.Node // nil while down
	trans    *faultnet.Transport
	stores   *server.Stores // Memory storage: survives crashes
	starts   int
	spare    bool // first start neither bootstraps nor joins: it waits to be added
	retired  bool // removed from the cluster: stopped for good, not compared
}

// MaxSpares is how many nodes AddSpare may add to a cluster.
const MaxSpares = 2

// Start boots opts.Nodes nodes (node 0 bootstraps, the others join) and
// waits for a leader. The network starts reliable. t.Cleanup stops it.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	c := &Cluster{T: t, Net: faultnet.New(opts.Seed), opts: opts, dir: t.TempDir(),
		ip: faultnet.LoopbackIP(), skew: make([]atomic.Int64, opts.Nodes+MaxSpares)}
	c.Net.SetLogf(t.Logf)
	t.Cleanup(c.Shutdown)
	t.Cleanup(func() {
		if n := c.Net.Stats.Impostors.Load(); n > 0 {
			t.Errorf("%d Raft RPCs were answered by a node of another cluster: the harness is broken", n)
		}
	})
	for i := 0; i < opts.Nodes; i++ {
		s := &slot{id: fmt.Sprintf("n%d", i), dataDir: filepath.Join(c.dir, fmt.Sprintf("n%d", i))}
		if opts.Storage == Memory {
			s.stores = newMemStores()
		}
		c.nodes = append(c.nodes, s)
	}
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
	}
	c.WaitLeader(60 * time.Second)
	return c
}

func newMemStores() *server.Stores {
	st := raft.NewInmemStore()
	return &server.Stores{Log: st, Stable: st, Snapshots: server.NewMemorySnapshots()}
}

// IDs returns every node's ID, in index order.
func (c *Cluster) IDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.id
	}
	return out
}

// Size is the number of nodes, running, down or retired.
func (c *Cluster) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// AddSpare starts a new node that neither bootstraps nor joins: it waits
// until a member adds it (as client/replace does). It returns its index.
func (c *Cluster) AddSpare() (int, error) {
	c.mu.Lock()
	i := len(c.nodes)
	if i >= len(c.skew) {
		c.mu.Unlock()
		return -1, fmt.Errorf("at most %d spares", MaxSpares)
	}
	s := &slot{id: fmt.Sprintf("n%d", i), dataDir: filepath.Join(c.dir, fmt.Sprintf("n%d", i)), spare: true}
	if c.opts.Storage == Memory {
		s.stores = newMemStores()
	}
	c.nodes = append(c.nodes, s)
	c.mu.Unlock()
	return i, c.start(i)
}

// Retire stops node i for good, as an operator stops a node that was
// removed from the cluster: it is never restarted nor compared again.
func (c *Cluster) Retire(i int) {
	c.Crash(i)
	c.mu.Lock()
	c.nodes[i].retired = true
	c.mu.Unlock()
	c.Net.Logf("harness: retire %s", c.nodes[i].id)
}

// RaftAddr returns node i's Raft address ("" before its first start).
func (c *Cluster) RaftAddr(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].raftAddr
}

// DataDir returns node i's data directory (Disk storage).
func (c *Cluster) DataDir(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].dataDir
}

// APIAddr returns node i's API address ("" before its first start).
func (c *Cluster) APIAddr(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].apiAddr
}

// Node returns node i, or nil while it is down.
func (c *Cluster) Node(i int) *server.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].node
}

// Up reports which nodes are running.
func (c *Cluster) Up() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, s := range c.nodes {
		if s.node != nil {
			out = append(out, i)
		}
	}
	return out
}

// APIAddrs returns the API address of every node that has ever run.
func (c *Cluster) APIAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, s := range c.nodes {
		if s.apiAddr != "" {
			out = append(out, s.apiAddr)
		}
	}
	return out
}

func (c *Cluster) tuning() server.RaftTuning {
	t := server.DefaultRaftTuning()
	// Several clusters share the test process: a 512-entry log cache of
	// multi-MiB writes on every node would take gigabytes.
	t.LogCacheSize = 64
	if c.opts.SnapshotThreshold != 0 {
		t.SnapshotThreshold = c.opts.SnapshotThreshold
	}
	if c.opts.TrailingLogs != 0 {
		t.TrailingLogs = c.opts.TrailingLogs
	}
	if c.opts.Tune != nil {
		c.opts.Tune(&t)
	}
	return t
}

// start starts node i on its addresses (new ones on the first start).
func (c *Cluster) start(i int) error {
	c.mu.Lock()
	s := c.nodes[i]
	if s.node != nil || s.retired {
		c.mu.Unlock()
		return fmt.Errorf("node %d is running or retired", i)
	}
	var join []string
	for j, o := range c.nodes {
		if j != i && o.node != nil {
			join = append(join, o.apiAddr)
		}
	}
	c.mu.Unlock()

	tune := c.tuning()
	trans, err := c.transport(s, tune)
	if err != nil {
		return err
	}
	apiAddr := s.apiAddr
	if apiAddr == "" {
		apiAddr = c.ip + ":0"
	}
	cfg := server.Config{
		ID: s.id, DataDir: s.dataDir, APIAddr: apiAddr,
		Bootstrap: i == 0 && s.starts == 0,
		Transport: trans, Raft: tune,
		Logger: testLogger(), RaftLogLevel: raftLogLevel(),
		// Forwarding, status fan-out and block sync between nodes cross
		// the Net like clients do.
		PeerDialer: c.Dialer(s.id),
	}
	switch c.opts.Storage {
	case Memory:
		cfg.Stores = s.stores
	case Ephemeral:
		cfg.Ephemeral = true
	}
	if !cfg.Bootstrap && !(s.spare && s.starts == 0) {
		cfg.Join = join
	}
	cfg.Clock = func() time.Time { return time.Now().Add(time.Duration(c.skew[i].Load())) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := newNode(ctx, cfg)
	if err != nil {
		_ = trans.Close()
		return err
	}
	c.mu.Lock()
	s.node, s.trans, s.apiAddr = n, trans, n.APIAddr()
	s.starts++
	restarted := s.starts > 1
	c.mu.Unlock()
	if restarted && c.opts.Storage == Ephemeral {
		return c.waitCaughtUp(i, 60*time.Second)
	}
	return nil
}

// newNode retries server.New while the API port of a restarting node is
// still held by the old incarnation's sockets.
func newNode(ctx context.Context, cfg server.Config) (*server.Node, error) {
	for {
		n, err := server.New(ctx, cfg)
		if err == nil {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// transport binds node s's Raft TCP transport (on its old address after a
// crash) and wraps it with the Net's faults.
func (c *Cluster) transport(s *slot, tune server.RaftTuning) (*faultnet.Transport, error) {
	bind := s.raftAddr
	if bind == "" {
		bind = c.ip + ":0"
	}
	var stream *streamLayer
	var err error
	deadline := time.Now().Add(20 * time.Second)
	for {
		stream, err = listenStream(bind)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the old listener is still closing
	}
	if err != nil {
		return nil, fmt.Errorf("raft transport on %s: %w", bind, err)
	}
	// Over our stream layer, not raft.NewTCPTransport's: closing the
	// transport must close its connections (see streamLayer).
	inner := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: tune.TransportPool, MaxRPCsInFlight: tune.MaxRPCsInFlight,
		Timeout: tune.TransportTimeout, Logger: quietHclog(),
	})
	s.raftAddr = string(inner.LocalAddr())
	return faultnet.WrapTransport(c.Net, raft.ServerID(s.id), inner), nil
}

// Crash stops node i abruptly (no leadership transfer, no final
// snapshot) and closes its transport. Its state survives per Storage.
func (c *Cluster) Crash(i int) {
	c.mu.Lock()
	s := c.nodes[i]
	n, tr := s.node, s.trans
	s.node, s.trans = nil, nil
	c.mu.Unlock()
	if n == nil {
		return
	}
	c.Net.Logf("harness: crash %s", s.id)
	n.Kill()
	_ = tr.Close()
	if c.opts.Storage == Ephemeral {
		// Nothing of the old incarnation may reach the new one.
		s.stores = nil
	}
}

// Restart starts crashed node i again with whatever its storage kept. A
// node with ephemeral storage comes back empty and Restart returns once it
// has caught up.
func (c *Cluster) Restart(i int) error {
	c.Net.Logf("harness: restart %s", c.nodes[i].id)
	return c.start(i)
}

// SkewClock makes node i's leader clock run d ahead of (or, negative,
// behind) real time: the times a leader stamps on entries, on which session
// leases run out, jump with it.
func (c *Cluster) SkewClock(i int, d time.Duration) {
	c.skew[i].Store(int64(d))
	c.Net.Logf("harness: %s clock skew %v", c.nodes[i].id, d)
}

// Leader returns the index of a running node that is Raft leader, or -1.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.nodes {
		if s.node != nil && s.node.IsLeader() {
			return i
		}
	}
	return -1
}

// WaitLeader polls until some running node leads; it fails the test after
// timeout.
func (c *Cluster) WaitLeader(timeout time.Duration) int {
	c.T.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if l := c.Leader(); l >= 0 {
			return l
		}
		if time.Now().After(deadline) {
			c.T.Fatalf("no leader within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// IndexOf returns the index of node id, or -1.
func (c *Cluster) IndexOf(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.nodes {
		if s.id == id {
			return i
		}
	}
	return -1
}

// nodeOfAddr maps an API address to a node ID ("" when unknown).
func (c *Cluster) nodeOfAddr(addr string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.nodes {
		if s.apiAddr == addr {
			return s.id
		}
	}
	return ""
}

// Dialer returns a client dialer whose connections are the links from
// endpoint name to each node in the Net.
func (c *Cluster) Dialer(name string) client.Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		id := c.nodeOfAddr(addr)
		if id == "" {
			id = addr
		}
		return c.Net.Dial(ctx, name, id, addr)
	}
}

// Client connects a client named name (its endpoint in the Net) to the
// given nodes (all when none are given).
func (c *Cluster) Client(ctx context.Context, name string, nodes []int, opts ...client.Option) (*client.Client, error) {
	var addrs []string
	if nodes == nil {
		addrs = c.APIAddrs()
	} else {
		c.mu.Lock()
		for _, i := range nodes {
			addrs = append(addrs, c.nodes[i].apiAddr)
		}
		c.mu.Unlock()
	}
	opts = append([]client.Option{client.WithDialer(c.Dialer(name)), client.WithName(name)}, opts...)
	if PlantStaleReads() {
		opts = append(opts, client.WithConsistency(pb.Consistency_STALE))
	}
	return client.New(ctx, addrs, opts...)
}

// Shutdown crashes every node, resets every relayed connection and drops
// the in-memory stores of Memory storage. The cluster itself stays
// reachable after its test: package testing keeps a finished parallel
// subtest, and with it this cleanup closure, until the parent test ends,
// so a soak of a hundred clusters would otherwise keep every in-memory
// Raft log and snapshot it ever wrote.
func (c *Cluster) Shutdown() {
	var wg sync.WaitGroup
	for i := range c.Size() {
		wg.Add(1)
		go func() { defer wg.Done(); c.Crash(i) }()
	}
	wg.Wait()
	c.Net.ResetConns("")
	c.mu.Lock()
	for _, s := range c.nodes {
		s.stores = nil
	}
	c.mu.Unlock()
}

// PlantStaleReads reports whether MEMFS_PLANT=stale-reads asks for the
// planted-bug experiment of docs/testing.md: every client then reads a
// node's local state without confirming leadership, which the suite must
// catch as a linearizability violation. Never set in CI.
func PlantStaleReads() bool { return os.Getenv("MEMFS_PLANT") == "stale-reads" }

// raftLogLevel is hashicorp/raft's log level in the nodes: off unless
// MEMFS_TEST_RAFT_LOG asks (the faults make Raft complain all the time).
func raftLogLevel() string {
	if v := os.Getenv("MEMFS_TEST_RAFT_LOG"); v != "" {
		return v
	}
	return "off"
}

// testLogger logs the nodes' warnings and errors to stderr;
// MEMFS_TEST_LOG=info or debug shows more, MEMFS_TEST_LOG=off nothing.
func testLogger() *slog.Logger {
	v := os.Getenv("MEMFS_TEST_LOG")
	if v == "off" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	level := slog.LevelError
	_ = level.UnmarshalText([]byte(v))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Network, NodeIDs and CanLoseAll, with Leader, Crash, Up and Restart,
// make the cluster a workload.Target.
func (c *Cluster) Network() *faultnet.Net { return c.Net }

// NodeIDs returns every node's ID, in index order.
func (c *Cluster) NodeIDs() []string { return c.IDs() }

// CanLoseAll reports whether every node may crash at once without losing
// acknowledged data.
func (c *Cluster) CanLoseAll() bool { return c.opts.Storage != Ephemeral }

// waitCaughtUp polls until node i has applied what the leader had applied
// when it was called: a node that restarted empty must hold the data again
// before another node may go.
func (c *Cluster) waitCaughtUp(i int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var target uint64
	for target == 0 {
		if l := c.Leader(); l >= 0 && l != i {
			if n := c.Node(l); n != nil {
				target = n.AppliedIndex()
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no leader to catch up from")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	n := c.Node(i)
	if n == nil {
		return fmt.Errorf("node %d is down", i)
	}
	return n.WaitApplied(ctx, target)
}

// CheckConverged waits until every node runs and has applied what the
// leader has, then fails t unless every node's state machine holds the same
// totals and the same contents for each path (a directory's listing, a
// file's bytes).
func (c *Cluster) CheckConverged(t testing.TB, paths []string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		diff, err := c.compareReplicas(paths, time.Until(deadline))
		if err == nil && diff == "" {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = diff
		}
		if time.Now().After(deadline) {
			t.Errorf("replicas did not converge within %v: %s", timeout, last)
			c.convergenceForensics(t)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) compareReplicas(paths []string, timeout time.Duration) (string, error) {
	l := c.Leader()
	if l < 0 {
		return "", fmt.Errorf("no leader")
	}
	target := c.Node(l).AppliedIndex()
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	var ref []string
	refID := ""
	for i := range c.Size() {
		if c.retired(i) {
			continue
		}
		n := c.Node(i)
		if n == nil {
			return "", fmt.Errorf("node %d is down", i)
		}
		if err := n.WaitApplied(ctx, target); err != nil {
			return "", fmt.Errorf("node %s applied %d of %d: %w", n.ID(), n.AppliedIndex(), target, err)
		}
		got := replicaState(n, paths)
		if ref == nil {
			ref, refID = got, n.ID()
			continue
		}
		for k := range got {
			if got[k] != ref[k] {
				return fmt.Sprintf("%s and %s differ: %q vs %q", refID, n.ID(), clip(ref[k]), clip(got[k])), nil
			}
		}
	}
	return "", nil
}

// replicaState describes what node n holds: totals, then one line per
// path.
func replicaState(n *server.Node, paths []string) []string {
	st := n.FSM().Stats()
	out := []string{fmt.Sprintf("inodes=%d logical=%d", st.Inodes, st.LogicalBytes)}
	for _, p := range paths {
		res := n.FSM().Query(&pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: p}}}})
		if res.GetErrno() != 0 {
			out = append(out, fmt.Sprintf("%s: errno %d", p, res.GetErrno()))
			continue
		}
		a := res.GetAttr()
		line := fmt.Sprintf("%s: mode=%o size=%d", p, a.GetMode(), a.GetSize())
		if a.GetMode()&0o170000 == 0o040000 {
			r := n.FSM().Query(&pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: &pb.Loc{Path: p}, Limit: 1000}}})
			for _, e := range r.GetEntries() {
				line += " " + e.GetName()
			}
		} else {
			r := n.FSM().Query(&pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: p}, Length: int64(a.GetSize())}}})
			line += fmt.Sprintf(" errno=%d data=%x", r.GetErrno(), sha256.Sum256(r.GetData()))
		}
		out = append(out, line)
	}
	return out
}

func (c *Cluster) retired(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].retired
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// SnapshotIndexes returns each running node's last snapshot index as Raft
// reports it (-1 for a node that is down).
func (c *Cluster) SnapshotIndexes() []int64 {
	out := make([]int64, c.Size())
	for i := range out {
		out[i] = -1
		if n := c.Node(i); n != nil {
			var v int64
			_, _ = fmt.Sscan(n.Raft().Stats()["last_snapshot_index"], &v)
			out[i] = v
		}
	}
	return out
}
